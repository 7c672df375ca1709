//! `tollgate -c conf/tollgate.yaml` (Pingora's `-c/-d/-u/-t` flags keep their meaning),
//! `tollgate store copy --from … --to …` (see `store::copy`), `tollgate --version`, `--help`.

use pingora_core::server::configuration::Opt;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[cfg(all(feature = "mimalloc", not(feature = "jemalloc")))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `tollgate --help`.
const HELP: &str = "\
tollgate — an edge gateway for model APIs (chat completions, messages, generate-content, video)

Usage:
  tollgate [-c FILE] [-t] [-d] [-u]   start the gateway (or check its configuration with -t)
  tollgate store copy --from sled:DIR|postgres:URL --to sled:DIR|postgres:URL [--ca-file FILE]
  tollgate --version | --help

Options:
  -c, --conf FILE  the configuration file (default: conf/tollgate.yaml, relative to the
                   working directory; the systemd unit uses /etc/tollgate/tollgate.yaml)
  -t, --test       check the configuration (and reach store.postgres when set), print the
                   result and exit: 0 valid, 2 not (one line naming the key at fault)
  -t --explain-rewrite PROVIDER
                   check the configuration and show what each of the provider's rewrite
                   rules does to a sample request of its protocol
  -d, --daemon     run in the background (pingora.pid_file names the pid file)
  -u, --upgrade    take the listening sockets over from the running tollgate (pingora.upgrade_sock),
                   then send it SIGQUIT: a zero-downtime upgrade
  -h, --help       this text
  -V, --version    the version and the commit it was built from

Environment:
  RUST_LOG               log level (info by default; warn for less, debug for more)
  TOLLGATE_ADMIN_TOKEN   the admin token, when the file says admin: { token_env: TOLLGATE_ADMIN_TOKEN }
                         (any `*_env` key of the file names a variable the same way)

Signals: SIGHUP reloads the file, SIGTERM drains and stops, SIGQUIT hands over to a -u process.
The admin API listens on admin.listen (loopback only) and wants `Authorization: Bearer <token>`;
see docs/keys.md.
";

fn main() {
    tollgate::observe::logging::init("info");
    let args: Vec<String> = std::env::args().collect();
    // `--help` and `--version` anywhere on a start's line are tollgate's own (Pingora's parser
    // would print its help, or refuse `-t --version`); a `store` line has its own.
    if args.get(1).map(String::as_str) != Some("store") {
        if args.iter().skip(1).any(|a| a == "--help" || a == "-h") {
            print!("{HELP}");
            return;
        }
        if args.iter().skip(1).any(|a| a == "--version" || a == "-V") {
            println!("tollgate {}", tollgate::VERSION);
            return;
        }
    }
    if args.get(1).map(String::as_str) == Some("store") {
        let (code, text) = tollgate::store::copy::cli(&args[2..]);
        if code == 0 {
            println!("tollgate: {text}");
        } else {
            eprintln!("tollgate: {text}");
        }
        std::process::exit(code);
    }
    if let Some(at) = args.iter().position(|a| a == "--explain-rewrite") {
        std::process::exit(explain_rewrite(&args, at));
    }
    let opt = Opt::parse_args();
    if let Err(e) = tollgate::server::run(opt) {
        eprintln!("tollgate: {e}");
        std::process::exit(2);
    }
}

/// `tollgate [-c FILE] -t --explain-rewrite PROVIDER`: the exit status.
fn explain_rewrite(args: &[String], at: usize) -> i32 {
    let Some(provider) = args.get(at + 1).filter(|p| !p.starts_with('-')) else {
        eprintln!("tollgate: --explain-rewrite names a provider");
        return 2;
    };
    let conf =
        args.iter().position(|a| a == "-c" || a == "--conf").and_then(|i| args.get(i + 1)).map_or("conf/tollgate.yaml", String::as_str);
    let config = match tollgate::config::Config::load(std::path::Path::new(conf)) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("tollgate: {e}");
            return 2;
        }
    };
    match tollgate::upstream::rewrite::explain(&config, provider) {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("tollgate: {e}");
            2
        }
    }
}
