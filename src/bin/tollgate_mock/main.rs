//! `tollgate-mock --listen 127.0.0.1:9100 --key mock-upstream-key`: the mock upstream for
//! tests, benchmarks and the offline demo (see `upstream.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // the mock upstream of tests and benchmarks: a failure here is a failed run, not a client's answer

use clap::Parser;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::Server;
mod agent;
mod batches;
mod bodies;
mod cloud;
mod mcp;
mod media;
mod oidc;
mod realtime;
mod tc;
mod upstream;
mod video_bytes;
mod wire;

use upstream::MockUpstream;

/// The mock upstream of tollgate's tests, benchmarks and offline demo: chat completions,
/// messages, generate-content and the video service, answering from headers (`x-mock-*`).
#[derive(Parser)]
#[command(name = "tollgate-mock", version = tollgate::VERSION)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: String,
    /// The upstream key requests must carry.
    #[arg(long, default_value = "mock-upstream-key")]
    key: String,
    /// SecretId the mock video service expects in TC3 signatures.
    #[arg(long, default_value = "mock-tc-secret-id")]
    tc_secret_id: String,
    /// SecretKey the mock video service verifies TC3 signatures with.
    #[arg(long, default_value = "mock-tc-secret-key")]
    tc_secret_key: String,
    /// Serve HTTPS with this PEM certificate (with --tls-key).
    #[arg(long)]
    tls_cert: Option<String>,
    #[arg(long)]
    tls_key: Option<String>,
    /// AWS access key id Bedrock requests must be signed with.
    #[arg(long, default_value = "AKIDMOCKTOLLGATE")]
    aws_access_key_id: String,
    /// AWS secret key the mock verifies Bedrock's SigV4 signatures with.
    #[arg(long, default_value = "mock-aws-secret-access-key")]
    aws_secret_access_key: String,
    /// PEM public key of the Google service account whose token assertions are accepted.
    #[arg(long)]
    google_public_key: Option<String>,
    /// Client secret the mock's Entra ID token endpoint accepts.
    #[arg(long, default_value = "mock-entra-client-secret")]
    entra_client_secret: String,
    /// Lifetime of the tokens the mock issues.
    #[arg(long, default_value_t = 3600)]
    token_lifetime_secs: u64,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

/// The public key of the bundled demo's throwaway Google service account.
const DEMO_GOOGLE_PUBLIC_KEY: &[u8] = include_bytes!("../../../conf/demo/vertex-sa.pub.pem");

fn main() {
    tollgate::observe::logging::init("warn");
    let args = Args::parse();
    // SIGTERM stops the mock at once (Pingora's defaults wait a minute for a grace period).
    let conf = ServerConf {
        threads: args.threads,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    // Without the flag: the bundled demo's throwaway service account (conf/demo/), so the
    // bundled configuration's Vertex provider signs in offline.
    let google_public_key = Some(match args.google_public_key.as_ref() {
        Some(path) => match std::fs::read(path) {
            Ok(pem) => pem,
            Err(e) => {
                eprintln!("tollgate-mock: --google-public-key {path}: {e}");
                std::process::exit(2);
            }
        },
        None => DEMO_GOOGLE_PUBLIC_KEY.to_vec(),
    });
    let cloud = cloud::CloudMock::new(
        (args.aws_access_key_id.clone(), args.aws_secret_access_key.clone()),
        google_public_key,
        args.entra_client_secret.clone(),
        args.token_lifetime_secs,
    );
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        MockUpstream::new(args.key, args.tc_secret_id, args.tc_secret_key, cloud),
        "tollgate-mock",
    );
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            if let Err(e) = service.add_tls(&args.listen, cert, key) {
                eprintln!("tollgate-mock: tls: {e}");
                std::process::exit(2);
            }
        }
        _ => service.add_tcp(&args.listen),
    }
    server.add_service(service);
    server.run_forever();
}
