// A Go program built with cgo (docs/design/run.md, "Programs whose stacks are in their
// heap"): with cgo, Go's runtime maps its heap through libc, so `attune run` manages it,
// and goroutine stacks live there. argv[1] = MiB of a C buffer (default 96) filled from
// Go and checked by C; 64 goroutines grow deep stacks and fill maps, then a collection.
// Before the Go runtime was detected, auto delivery hung in UFFDIO_MOVE (a resolver
// running on a goroutine stack evicted the page under its own frame) and forced signal
// delivery died of SIGSEGV (a signal frame the kernel could not write).
package main

/*
#include <stdlib.h>
#include <stdint.h>
static uint64_t csum(const unsigned char *p, size_t n) {
	uint64_t s = 0;
	for (size_t i = 0; i < n; i += 61) s = s * 31 + p[i];
	return s;
}
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
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

func main() {
	mib := 96
	if len(os.Args) > 1 {
		mib, _ = strconv.Atoi(os.Args[1])
	}
	n := mib << 20
	p := C.malloc(C.size_t(n))
	b := unsafe.Slice((*byte)(p), n)
	for i := range b {
		b[i] = byte(i*7 + i>>12)
	}
	want := uint64(0)
	for i := 0; i < n; i += 61 {
		want = want*31 + uint64(byte(i*7+i>>12))
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
	got := uint64(C.csum((*C.uchar)(p), C.size_t(n)))
	C.free(p)
	sum := 0
	for g, r := range results {
		// deep(2000, m[g]) adds pad[k%512] = byte(k) for k = 2000..1, and len(m[g]) = 100+g.
		w := 100 + g + 20000
		for k := 1; k <= 2000; k++ {
			w += int(byte(k))
		}
		if r != w {
			fmt.Println("go_cgo: goroutine", g, "got", r, "want", w)
			os.Exit(1)
		}
		sum += r
	}
	if got != want {
		fmt.Println("go_cgo: checksum WRONG", got, want)
		os.Exit(1)
	}
	fmt.Println("go_cgo: OK", mib, "MiB", sum)
}
