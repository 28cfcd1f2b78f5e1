// The C code linked into this library (mimalloc, under the runtime's small-object
// allocator) calls mmap, munmap, madvise and mremap. This library exports those very
// symbols, so without this its own internal mappings would come back into the
// interposer. --wrap binds the library's internal references to the `__wrap_*`
// functions (raw system calls, src/wrap.rs); the program's references are unaffected.
// The library's Rust code is bound the same way: it must never call its own exported
// mmap, munmap, madvise or mremap by name (hooks.rs calls the implementations; a call to
// `mmap` from `mmap64` once sent every mmap64 to the kernel unmanaged).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--wrap=mmap,--wrap=munmap,--wrap=madvise,--wrap=mremap,--wrap=mmap64");
}
