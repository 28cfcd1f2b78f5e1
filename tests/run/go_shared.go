// A Go library built with -buildmode=c-shared, loaded by a C program
// (tests/run/go_shared_main.c) that also imports a POSIX AIO call: the loader scan meets
// the program's import first, and must still find the Go runtime in the library
// (docs/design/run.md, "Programs whose stacks are in their heap"). Before, the scan stopped
// at its first find, so under `--fault-mode signal` the library's goroutine stacks were
// tiered where no signal can serve them. GoWork(mib) fills a C buffer of mib MiB from Go,
// runs 64 goroutines with deep stacks and maps, collects, and checks everything.
package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

func deep(n int, acc []byte) int {
	var pad [512]byte
	pad[n%512] = byte(n)
	if n == 0 {
		return int(pad[0]) + len(acc)
	}
	return deep(n-1, acc) + int(pad[n%512])
}

//export GoWork
func GoWork(mib C.int) C.int {
	n := int(mib) << 20
	p := C.malloc(C.size_t(n))
	defer C.free(p)
	b := unsafe.Slice((*byte)(p), n)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	var wg sync.WaitGroup
	results := make([]int, 64)
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			m := make(map[int][]byte)
			for i := 0; i < 20000; i++ {
				m[i] = make([]byte, 100+g)
			}
			results[g] = deep(2000, m[g]) + len(m)
		}(g)
	}
	wg.Wait()
	runtime.GC()
	for i := range b {
		if b[i] != byte(i*7+i>>12) {
			fmt.Println("go_shared: byte", i, "WRONG")
			return 1
		}
	}
	for g, r := range results {
		w := 100 + g + 20000
		for k := 1; k <= 2000; k++ {
			w += int(byte(k))
		}
		if r != w {
			fmt.Println("go_shared: goroutine", g, "got", r, "want", w)
			return 1
		}
	}
	return 0
}

func main() {}
