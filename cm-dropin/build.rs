//! Gives the drop-in library the soname and the symbol version nodes the Debian binaries need.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = format!("{dir}/dropin.map");
    println!("cargo:rerun-if-changed={map}");
    // One library serves both sonames: it is installed as libibverbs.so.1 with librdmacm.so.1
    // a link to the same file, so the loader maps it once and all state lives in one copy.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map}");
}
