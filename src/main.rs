//! `tollgate -c conf/tollgate.yaml` (Pingora's `-c/-d/-u/-t` flags keep their meaning), and
//! `tollgate store copy --from … --to …` (see `store::copy`).

use pingora_core::server::configuration::Opt;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    tollgate::logging::init("info");
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("store") {
        let (code, text) = tollgate::store::copy::cli(&args[2..]);
        if code == 0 {
            println!("tollgate: {text}");
        } else {
            eprintln!("tollgate: {text}");
        }
        std::process::exit(code);
    }
    let opt = Opt::parse_args();
    if let Err(e) = tollgate::server::run(opt) {
        eprintln!("tollgate: {e}");
        std::process::exit(2);
    }
}
