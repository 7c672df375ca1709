//! Who may reach the admin API: its token (given, or generated once into `data_dir`), and the
//! `Host` and `Origin` a request must carry (no DNS rebinding, no cross-site form).

use crate::base::secrets::random_base62;

/// Whether a request's `Host` names this loopback listener: `localhost`, a loopback address
/// literal (either with a port), or a name the operator listed. Any other name is a request a
/// browser was steered to through DNS rebinding, and is refused.
pub fn host_allowed(host: Option<&str>, extra: &[String]) -> bool {
    let Some(host) = host.map(str::trim).filter(|h| !h.is_empty()) else { return false };
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inner, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())) => {
                inner
            }
            _ => return false,
        }
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return false,
            None => host,
        }
    };
    let name = name.to_ascii_lowercase();
    name == "localhost" || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) || extra.contains(&name)
}

/// A browser's request carries `Origin`: accepted only from the admin listener's own origin
/// (`http://` and the request's accepted `Host`), so no other page can drive the admin API.
pub fn origin_allowed(origin: Option<&str>, host: Option<&str>) -> bool {
    match origin {
        None => true,
        Some(origin) => host.is_some_and(|h| origin.eq_ignore_ascii_case(&format!("http://{h}"))),
    }
}

/// The admin token of a configuration that sets none: the one in `data_dir/admin-token`, or a
/// random one written there now (mode 0600, created exclusively). Returns it, the file and
/// whether it was made now. A file that holds no usable token is an error naming it.
pub fn token_file(data_dir: &std::path::Path) -> Result<(String, std::path::PathBuf, bool), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.chars().count() < crate::config::listen::MIN_ADMIN_TOKEN_LEN {
                return Err(format!(
                    "{}: holds no admin token of at least {} characters; delete it to have one generated",
                    path.display(),
                    crate::config::listen::MIN_ADMIN_TOKEN_LEN
                ));
            }
            Ok((token, path, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = random_base62(43);
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("{}: cannot create the admin token file: {e}", path.display()))?;
            file.write_all(format!("{token}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("{}: cannot write the admin token file: {e}", path.display()))?;
            Ok((token, path, true))
        }
        Err(e) => Err(format!("{}: cannot read the admin token file: {e}", path.display())),
    }
}

pub(super) fn new_secret() -> String {
    format!("sk-tg-{}", random_base62(40))
}

/// The file that holds the admin token of a configuration that sets none.
pub const TOKEN_FILE: &str = "admin-token";
