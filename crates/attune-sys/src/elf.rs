//! The objects the dynamic loader has loaded into this process, and the symbols each
//! imports: read from their dynamic sections under the loader's lock
//! (`dl_iterate_phdr`). `attune run` uses it to see whether a program can hand its memory
//! to the kernel outside the calls the interposer wraps (`attune_policy::delivery`).
//!
//! An object's imports are the symbols its relocations name that it does not define
//! (section index `SHN_UNDEF`): the PLT relocations (`DT_JMPREL`) and the others
//! (`DT_RELA`), which hold the imports of data and of functions whose address is taken.
//! Only `Elf64_Rela` tables are read (x86-64 and AArch64 use no other).
//!
//! An object linked by Go's linker is told apart by its build-ID note (owner "Go"), which
//! every Go program and shared library carries: its runtime runs goroutines on stacks in
//! its own heap (`attune_policy::delivery::GO_RUNTIME`).
//!
//! Not signal-safe: it takes the loader's lock and allocates.

use std::ffi::{c_int, c_void, CStr};

#[repr(C)]
struct Dyn {
    tag: i64,
    val: u64,
}

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

const PT_DYNAMIC: u32 = 2;
const PT_NOTE: u32 = 4;
/// The note Go's linker puts in every program and shared library it links: owner "Go",
/// type 4 (its build ID; `cmd/link`'s `ELF_NOTE_GOBUILDID_TAG`).
const GO_NOTE_TYPE: u32 = 4;

/// `Found::what` for an object that carries the Go runtime (its build-ID note).
pub const GO_RUNTIME: &str = "the Go runtime";
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_STRSZ: i64 = 10;
const DT_PLTREL: i64 = 20;
const DT_JMPREL: i64 = 23;

/// What a scan found in one object: the object, and the library name or imported symbol
/// that matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The loader's name of the object (the program itself: its `/proc/self/exe` path).
    pub object: String,
    /// The matching library name (the object's own) or imported symbol.
    pub what: String,
    pub by_import: bool,
}

/// Objects already scanned, by load base and name (a base alone could be reused by
/// another object after a `dlclose`).
#[derive(Default, Debug)]
pub struct Seen(Vec<(usize, String)>);

impl Seen {
    pub const fn new() -> Seen {
        Seen(Vec::new())
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The loader's counts of objects ever added and removed: they change with every
/// `dlopen` that loads and every `dlclose` that unloads, so an unchanged pair means
/// nothing new to scan. Costs one lock round trip.
pub fn generation() -> (u64, u64) {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: the loader passes a valid info for the call; data is our &mut (u64, u64).
        unsafe {
            let out = &mut *(data as *mut (u64, u64));
            *out = ((*info).dlpi_adds, (*info).dlpi_subs);
        }
        1
    }
    let mut g = (0u64, 0u64);
    // SAFETY: the callback only reads the info and writes through data, which outlives
    // the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut g as *mut _ as *mut c_void) };
    g
}

struct Scan<'a> {
    seen: &'a mut Seen,
    library: &'a dyn Fn(&str) -> bool,
    import: &'a dyn Fn(&str) -> bool,
    found: Vec<Found>,
}

/// Scans the objects loaded since the last scan with `seen` (all, the first time) and
/// returns, in the loader's order, each whose own name satisfies `library`, which carries
/// the Go runtime where `library` accepts [`GO_RUNTIME`], or which imports a symbol that
/// satisfies `import` (one find an object, in that order). Every object looked at is added
/// to `seen`. All finds, not the first: a program that imports POSIX AIO and loads a Go
/// library has both judged (`tests/run/go_shared_main.c`; stopping at the program's own
/// import left the Go runtime's stacks under signal delivery, and it died of SIGSEGV).
pub fn scan_new(
    seen: &mut Seen,
    library: &dyn Fn(&str) -> bool,
    import: &dyn Fn(&str) -> bool,
) -> Vec<Found> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: data is the &mut Scan passed below; info is valid for the call, and the
        // loader's lock keeps the object mapped while we read its dynamic section.
        unsafe {
            let s = &mut *(data as *mut Scan);
            let info = &*info;
            let base = info.dlpi_addr as usize;
            let mut name = if info.dlpi_name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(info.dlpi_name)
                    .to_string_lossy()
                    .into_owned()
            };
            if s.seen.0.iter().any(|(b, n)| *b == base && *n == name) {
                return 0;
            }
            s.seen.0.push((base, name.clone()));
            if name.is_empty() {
                // The program itself.
                name = std::fs::read_link("/proc/self/exe")
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "the program".into());
            } else if (s.library)(&name) {
                s.found.push(Found {
                    object: name.clone(),
                    what: name,
                    by_import: false,
                });
                return 0;
            }
            let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
            if (s.library)(GO_RUNTIME) && has_go_note(base, phdrs) {
                s.found.push(Found {
                    object: name,
                    what: GO_RUNTIME.into(),
                    by_import: false,
                });
                return 0;
            }
            let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
                return 0;
            };
            if let Some(sym) = find_import(base, base + dynamic.p_vaddr as usize, s.import) {
                s.found.push(Found {
                    object: name,
                    what: sym,
                    by_import: true,
                });
            }
        }
        0
    }
    let mut scan = Scan {
        seen,
        library,
        import,
        found: Vec::new(),
    };
    // SAFETY: the callback reads only what the loader hands it and the dynamic sections
    // of loaded objects; scan outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut scan as *mut Scan as *mut c_void) };
    scan.found
}

/// Whether an object's note segments hold Go's build-ID note (owner "Go", type 4).
///
/// # Safety
/// `phdrs` are a loaded object's program headers and `base` its load base: its note
/// segments are mapped and readable.
unsafe fn has_go_note(base: usize, phdrs: &[libc::Elf64_Phdr]) -> bool {
    for ph in phdrs.iter().filter(|p| p.p_type == PT_NOTE) {
        let (mut at, end) = (
            base + ph.p_vaddr as usize,
            base + (ph.p_vaddr + ph.p_memsz) as usize,
        );
        let align = if ph.p_align == 8 { 8 } else { 4 };
        let up = |n: usize| (n + align - 1) & !(align - 1);
        while at + 12 <= end {
            // SAFETY: the header lies within the mapped note segment (checked above).
            let (namesz, descsz, kind) = unsafe {
                let w = at as *const u32;
                (*w as usize, *w.add(1) as usize, *w.add(2))
            };
            let name = at + 12;
            if name + up(namesz) + up(descsz) > end {
                break;
            }
            // SAFETY: the name lies within the segment (checked above).
            let owner = unsafe { std::slice::from_raw_parts(name as *const u8, namesz) };
            if kind == GO_NOTE_TYPE && owner.split(|&b| b == 0).next() == Some(b"Go") {
                return true;
            }
            at = name + up(namesz) + up(descsz);
        }
    }
    false
}

/// The first symbol the object at `base` with dynamic section `dynamic` imports that
/// satisfies `want`.
///
/// # Safety
/// `dynamic` must be the dynamic section of an object the loader keeps mapped for the
/// call (its lock held).
unsafe fn find_import(base: usize, dynamic: usize, want: &dyn Fn(&str) -> bool) -> Option<String> {
    // glibc relocates the address entries of a writable dynamic section in place; the
    // vDSO's and a read-only one's stay offsets from the base.
    let addr = |v: u64| -> usize {
        let v = v as usize;
        if v < base {
            base + v
        } else {
            v
        }
    };
    let (mut strtab, mut strsz, mut symtab) = (0usize, 0usize, 0usize);
    let (mut jmprel, mut pltrelsz, mut pltrel) = (0usize, 0usize, DT_RELA);
    let (mut rela, mut relasz) = (0usize, 0usize);
    let mut d = dynamic as *const Dyn;
    // SAFETY (whole function): the dynamic section ends with DT_NULL; the tables it names
    // lie in the object's mapped segments, which the loader itself read to relocate it.
    unsafe {
        for _ in 0..4096 {
            let e = &*d;
            match e.tag {
                DT_NULL => break,
                DT_STRTAB => strtab = addr(e.val),
                DT_STRSZ => strsz = e.val as usize,
                DT_SYMTAB => symtab = addr(e.val),
                DT_JMPREL => jmprel = addr(e.val),
                DT_PLTRELSZ => pltrelsz = e.val as usize,
                DT_PLTREL => pltrel = e.val as i64,
                DT_RELA => rela = addr(e.val),
                DT_RELASZ => relasz = e.val as usize,
                _ => {}
            }
            d = d.add(1);
        }
        if strtab == 0 || symtab == 0 {
            return None;
        }
        let mut tables = vec![(rela, relasz)];
        if pltrel == DT_RELA {
            tables.push((jmprel, pltrelsz));
        }
        for (table, size) in tables {
            if table == 0 {
                continue;
            }
            let n = size / std::mem::size_of::<Rela>();
            let relocs = std::slice::from_raw_parts(table as *const Rela, n);
            for r in relocs {
                let index = (r.info >> 32) as usize;
                if index == 0 {
                    continue; // relative and IRELATIVE relocations name no symbol
                }
                let sym = &*(symtab as *const Sym).add(index);
                if sym.shndx != 0 || sym.name == 0 || (strsz != 0 && sym.name as usize >= strsz) {
                    continue;
                }
                let name = CStr::from_ptr((strtab + sym.name as usize) as *const libc::c_char);
                if let Ok(name) = name.to_str() {
                    if want(name) {
                        return Some(name.to_string());
                    }
                }
            }
        }
    }
    None
}

const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;

/// The span of the executable segments of the loaded object whose code holds `addr`:
/// from the lowest start to the highest end of its `PT_LOAD` segments marked `PF_X`.
/// None when no object's code holds it. Takes the loader's lock.
pub fn code_span(addr: usize) -> Option<(usize, usize)> {
    code_owner(addr, false).map(|(span, _)| span)
}

/// The loader's name (its path; empty for the program itself) of the object whose code
/// holds `addr`, None when no object's does. Takes the loader's lock, and allocates.
pub fn code_object(addr: usize) -> Option<String> {
    code_owner(addr, true).map(|(_, name)| name)
}

fn code_owner(addr: usize, named: bool) -> Option<((usize, usize), String)> {
    struct Find {
        addr: usize,
        named: bool,
        span: Option<(usize, usize)>,
        name: String,
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: usize, data: *mut c_void) -> c_int {
        // SAFETY: data is the &mut Find passed below; info and its program headers are
        // valid for the call (the loader's lock is held).
        unsafe {
            let f = &mut *(data as *mut Find);
            let info = &*info;
            let base = info.dlpi_addr as usize;
            let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
            let code = phdrs
                .iter()
                .filter(|p| p.p_type == PT_LOAD && p.p_flags & PF_X != 0)
                .map(|p| {
                    let start = base + p.p_vaddr as usize;
                    (start, start + p.p_memsz as usize)
                });
            let (mut lo, mut hi, mut holds) = (usize::MAX, 0usize, false);
            for (s, e) in code {
                lo = lo.min(s);
                hi = hi.max(e);
                holds |= (s..e).contains(&f.addr);
            }
            if holds {
                f.span = Some((lo, hi));
                if f.named && !info.dlpi_name.is_null() {
                    f.name = CStr::from_ptr(info.dlpi_name)
                        .to_string_lossy()
                        .into_owned();
                }
                return 1; // stop
            }
        }
        0
    }
    let mut f = Find {
        addr,
        named,
        span: None,
        name: String::new(),
    };
    // SAFETY: the callback reads only what the loader hands it; f outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut f as *mut Find as *mut c_void) };
    f.span.map(|s| (s, f.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_imports_what_it_calls_and_nothing_else() {
        let mut seen = Seen::default();
        // Every Rust test binary imports `malloc` (through std's allocator).
        let found = scan_new(&mut seen, &|_| false, &|s| s == "malloc");
        // The program first, in the loader's order, and then every library that imports
        // it too (libstdc++'s and libgcc's allocations): not only the first.
        let f = found.first().expect("malloc import");
        assert!(f.by_import);
        assert_eq!(f.what, "malloc");
        assert!(found.iter().all(|f| f.by_import && f.what == "malloc"));
        assert!(!seen.is_empty());
        // A name nothing imports is not found, and nothing is found twice.
        let mut fresh = Seen::default();
        assert_eq!(
            scan_new(&mut fresh, &|_| false, &|s| s == "no_such_symbol_xyz"),
            vec![]
        );
        assert_eq!(
            scan_new(&mut fresh, &|_| true, &|_| true),
            vec![],
            "all seen already"
        );
    }

    #[test]
    fn a_go_build_id_note_is_found_and_others_are_not() {
        // A note segment as the loader maps it: a GNU build ID, then Go's (namesz 4,
        // descsz 5, type 4), each name and description padded to 4 bytes.
        let mut seg: Vec<u8> = Vec::new();
        let mut note = |name: &[u8], desc: &[u8], kind: u32| {
            seg.extend((name.len() as u32).to_ne_bytes());
            seg.extend((desc.len() as u32).to_ne_bytes());
            seg.extend(kind.to_ne_bytes());
            for part in [name, desc] {
                seg.extend(part);
                seg.resize(seg.len().next_multiple_of(4), 0);
            }
        };
        note(b"GNU\0", &[1; 20], 3);
        note(b"Go\0\0", b"abcde", GO_NOTE_TYPE);
        let ph = |len: usize| {
            // SAFETY: a zeroed program header is valid; the fields read are set.
            let mut p: libc::Elf64_Phdr = unsafe { std::mem::zeroed() };
            p.p_type = PT_NOTE;
            p.p_memsz = len as u64;
            p.p_align = 4;
            p
        };
        let base = seg.as_ptr() as usize;
        // SAFETY: the segment is `seg`, at offset 0 from `base`.
        unsafe {
            assert!(has_go_note(base, &[ph(seg.len())]));
            // Cut before Go's note: only the GNU one is whole.
            assert!(!has_go_note(base, &[ph(36)]));
            // A truncated header or an empty segment is no note.
            assert!(!has_go_note(base, &[ph(8)]));
            assert!(!has_go_note(base, &[]));
        }
        // This Rust test binary and its libraries carry no Go note.
        let mut seen = Seen::default();
        assert_eq!(
            scan_new(&mut seen, &|n| n == GO_RUNTIME, &|_| false),
            vec![]
        );
    }

    #[test]
    fn libraries_by_name_and_generation() {
        let mut seen = Seen::default();
        let found = scan_new(&mut seen, &|n| n.contains("libc.so"), &|_| false);
        let [f] = &found[..] else {
            panic!("libc once: {found:?}")
        };
        assert!(!f.by_import && f.object.contains("libc.so"));
        // Every object matched: the test binary's libraries by any name.
        let mut all = Seen::default();
        let libs = scan_new(&mut all, &|n| n.contains(".so"), &|_| false);
        assert!(libs.len() >= 2, "{libs:?}");
        let (adds, subs) = generation();
        assert!(adds >= seen.len() as u64 && subs <= adds, "{adds} {subs}");
    }

    #[test]
    fn the_code_span_holds_the_function_and_excludes_data() {
        let f = code_span as *const () as usize;
        let (lo, hi) = code_span(f).expect("this test binary's code");
        assert!(lo <= f && f < hi, "{lo:#x}..{hi:#x} {f:#x}");
        // libc's code is another object's.
        let m = libc::malloc as *const () as usize;
        let (l2, h2) = code_span(m).expect("libc's code");
        assert!(l2 <= m && m < h2 && (h2 <= lo || l2 >= hi));
        // A heap address is nobody's code.
        let b = Box::new(7u64);
        assert_eq!(code_span(&*b as *const u64 as usize), None);
    }

    #[test]
    fn the_code_object_is_named_by_the_loader() {
        // The program itself has the empty name; libc its path.
        assert_eq!(
            code_object(code_span as *const () as usize).as_deref(),
            Some("")
        );
        let libc_name = code_object(libc::malloc as *const () as usize).expect("libc's code");
        assert!(
            libc_name.rsplit('/').next().unwrap().starts_with("libc.so"),
            "{libc_name}"
        );
        let b = Box::new(7u64);
        assert_eq!(code_object(&*b as *const u64 as usize), None);
    }
}
