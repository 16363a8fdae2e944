//! Where environments are served: each notebook and inference endpoint on an origin of its
//! own, `<environment id>.<environments domain>`, never on the portal's. A notebook's pages
//! run code its owner controls; on an origin of their own that code cannot act with the
//! Berth session of whoever opens it, nor reach another notebook through shared cookies
//! (JupyterHub's `subdomain_host` answers the same problem the same way).

/// The environments' domain and how browsers reach it, e.g. `https://env.berth.example`
/// (each environment at `https://<id>.env.berth.example`) or, on a laptop, `http://localhost:3000`
/// (each at `http://<id>.localhost:3000`: browsers resolve `*.localhost` to loopback).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentOrigins {
    secure: bool,
    /// Lowercase, without a trailing dot.
    domain: String,
    port: Option<u16>,
}

impl Default for EnvironmentOrigins {
    /// `http://localhost:3000`, beside Berth's default `http://127.0.0.1:3000`.
    fn default() -> EnvironmentOrigins {
        EnvironmentOrigins::loopback(Some(3000))
    }
}

impl EnvironmentOrigins {
    /// Environments at `http://<id>.localhost[:port]`, for a Berth served on loopback.
    pub fn loopback(port: Option<u16>) -> EnvironmentOrigins {
        EnvironmentOrigins { secure: false, domain: "localhost".to_owned(), port }
    }

    /// Reads `https://env.berth.example[:port]`. Plain http is taken only for `localhost`
    /// (whose subdomains browsers keep on this machine): a notebook's cookie must not cross
    /// a network in the clear.
    pub fn parse(url: &str) -> Result<EnvironmentOrigins, String> {
        let trimmed = url.trim().trim_end_matches('/');
        let (secure, rest) = if let Some(rest) = trimmed.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = trimmed.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(format!("the environments URL must start with https:// (or http:// for localhost), not {url}"));
        };
        if rest.contains(['/', '?', '#', '@']) {
            return Err(format!(
                "the environments URL names a domain only (e.g. https://env.berth.example), without a path: {url}"
            ));
        }
        let (domain, port) = match rest.rsplit_once(':') {
            Some((domain, port)) => {
                let port = port.parse::<u16>().map_err(|_| format!("the environments URL has a bad port: {url}"))?;
                (domain, Some(port))
            }
            None => (rest, None),
        };
        let domain = domain.trim_end_matches('.').to_ascii_lowercase();
        if domain.is_empty() || !domain.split('.').all(valid_label) {
            return Err(format!(
                "the environments URL needs a DNS domain under which each environment gets a name: {url}"
            ));
        }
        if domain.split('.').all(|label| label.bytes().all(|b| b.is_ascii_digit())) {
            return Err(format!(
                "the environments URL needs a DNS domain, not an IP address (environments are <id>.<domain>): {url}"
            ));
        }
        if !secure && domain != "localhost" {
            return Err(format!(
                "plain http is allowed only for localhost (environments at http://<id>.localhost); \
                 serve environments over TLS: https://env.berth.example (got {url})"
            ));
        }
        Ok(EnvironmentOrigins { secure, domain, port })
    }

    /// Served over TLS: the environment's cookie is `Secure`.
    pub fn secure(&self) -> bool {
        self.secure
    }

    /// The environments' domain, e.g. `env.berth.example`.
    pub fn domain(&self) -> &str {
        &self.domain
    }

    /// Environment `id`'s origin, e.g. `https://<id>.env.berth.example`, no trailing slash.
    pub fn origin(&self, id: &str) -> String {
        let scheme = if self.secure { "https" } else { "http" };
        match self.port {
            Some(port) => format!("{scheme}://{id}.{}:{port}", self.domain),
            None => format!("{scheme}://{id}.{}", self.domain),
        }
    }

    /// The environment a request's `Host` names (`<id>.<domain>`, any port), if it names
    /// one; `None` for every other host, which is the portal's.
    pub fn environment_in_host(&self, host: &str) -> Option<String> {
        let host = host.trim().to_ascii_lowercase();
        if host.starts_with('[') {
            return None;
        }
        let name = match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            Some(_) => return None,
            None => host.as_str(),
        };
        let label = name.trim_end_matches('.').strip_suffix(&self.domain)?.strip_suffix('.')?;
        (valid_label(label)).then(|| label.to_owned())
    }
}

/// One DNS label: letters, digits and inner hyphens, at most 63 characters.
fn valid_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f0c2a1e-9b7d-4c6e-8f5a-1d2b3c4d5e6f";

    #[test]
    fn each_environment_gets_a_name_under_the_domain() {
        let origins = EnvironmentOrigins::parse("https://Env.Berth.Example/").expect("valid");
        assert_eq!(origins.origin(ID), format!("https://{ID}.env.berth.example"));
        assert!(origins.secure());
        assert_eq!(origins.environment_in_host(&format!("{ID}.env.berth.example")), Some(ID.to_owned()));
        assert_eq!(
            origins.environment_in_host(&format!("{}.ENV.berth.example:443", ID.to_uppercase())),
            Some(ID.into())
        );
        assert_eq!(origins.environment_in_host("env.berth.example"), None, "the domain itself is no environment");
        assert_eq!(origins.environment_in_host("berth.example"), None);
        assert_eq!(origins.environment_in_host(&format!("a.{ID}.env.berth.example")), None, "one label only");
        assert_eq!(origins.environment_in_host(&format!("{ID}.env.berth.example.evil.example")), None);
        assert_eq!(origins.environment_in_host(&format!("{ID}xenv.berth.example")), None);
        assert_eq!(origins.environment_in_host("[::1]:3000"), None);
    }

    #[test]
    fn on_a_laptop_environments_are_subdomains_of_localhost() {
        let origins = EnvironmentOrigins::loopback(Some(3000));
        assert_eq!(origins.origin(ID), format!("http://{ID}.localhost:3000"));
        assert!(!origins.secure());
        assert_eq!(origins.environment_in_host(&format!("{ID}.localhost:3000")), Some(ID.to_owned()));
        assert_eq!(origins.environment_in_host("127.0.0.1:3000"), None);
        assert_eq!(origins.environment_in_host("localhost:3000"), None);
        assert_eq!(EnvironmentOrigins::parse("http://localhost:8080"), Ok(EnvironmentOrigins::loopback(Some(8080))));
    }

    #[test]
    fn mistakes_are_explained() {
        let error = EnvironmentOrigins::parse("http://env.berth.example").expect_err("plain http on a network");
        assert!(error.contains("plain http is allowed only for localhost"), "{error}");
        assert!(EnvironmentOrigins::parse("env.berth.example").is_err());
        assert!(EnvironmentOrigins::parse("https://env.berth.example/notebooks").expect_err("path").contains("path"));
        assert!(EnvironmentOrigins::parse("https://10.0.0.1").expect_err("ip").contains("not an IP address"));
        assert!(EnvironmentOrigins::parse("https://env.berth.example:x").expect_err("port").contains("port"));
        assert!(EnvironmentOrigins::parse("https://-bad.example").is_err());
    }
}
