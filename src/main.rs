//! `tollgate -c conf/tollgate.yaml` (Pingora's `-c/-d/-u/-t` flags keep their meaning).

use pingora_core::server::configuration::Opt;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tollgate::logging::init("info");
    let opt = Opt::parse_args();
    if let Err(e) = tollgate::server::run(opt) {
        eprintln!("tollgate: {e}");
        std::process::exit(2);
    }
}
