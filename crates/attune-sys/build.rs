//! Builds the libfabric shim (`src/fabric_shim.c`) when libfabric's headers are here
//! (`libfabric-dev`; scripts/setup.sh installs them). Without them the crate builds
//! with `attune_no_fabric` and the remote tier reports that it was left out.
fn main() {
    println!("cargo:rustc-check-cfg=cfg(attune_no_fabric)");
    println!("cargo:rerun-if-changed=src/fabric_shim.c");
    let header = std::path::Path::new("/usr/include/rdma/fabric.h");
    println!("cargo:rerun-if-changed={}", header.display());
    // A package installs its headers with their release-time mtime, older than this
    // script's last run, so the header alone does not tell cargo that it appeared
    // (seen here: a build before `apt install libfabric-dev` stayed without the tier).
    // The directory's own mtime moves when a file is added to it.
    println!("cargo:rerun-if-changed=/usr/include/rdma");
    if !header.exists() {
        println!("cargo:rustc-cfg=attune_no_fabric");
        println!("cargo:warning=libfabric headers not found (apt install libfabric-dev): the remote tier is left out");
        return;
    }
    cc::Build::new()
        .file("src/fabric_shim.c")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("attune_fabric_shim");
    println!("cargo:rustc-link-lib=dl");
}
