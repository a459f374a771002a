//! Who may use the admin address: `admin_token`, `admin_token_file` and
//! `admin_token_for_reads`, checked into [`AdminAccess`].

use std::{fmt, path::PathBuf, sync::Arc};

use gray_config::Document;

use super::ConfigError;

/// The shortest token accepted: a guessable token protects nothing.
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// Who may use the admin address (`admin_token`, `admin_token_file`,
/// `admin_token_for_reads`); see the crate docs, *The admin page and its access*.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdminAccess {
    /// The bearer token every command needs (`Authorization: Bearer <token>`), if any.
    pub token: Option<AdminToken>,
    /// Whether reading (the API, `/metrics`, `/explain`) needs the token too; the page's
    /// own files and `/healthz` never do.
    pub for_reads: bool,
}

impl fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminAccess")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("for_reads", &self.for_reads)
            .finish()
    }
}

/// An admin bearer token: never printed ([`Debug`](fmt::Debug) redacts it), compared in
/// time that does not depend on where a guess differs.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken(Arc<str>);

impl AdminToken {
    /// Whether `presented` is this token, in time that depends only on the lengths.
    #[must_use]
    pub fn matches(&self, presented: &[u8]) -> bool {
        let token = self.0.as_bytes();
        let mut differ = u8::from(token.len() != presented.len());
        for (i, &b) in token.iter().enumerate() {
            differ |= b ^ presented.get(i).copied().unwrap_or(!b);
        }
        differ == 0
    }
}

impl fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// The three keys as the file gives them.
pub(super) struct AdminKeys<'a> {
    pub(super) token: Option<&'a str>,
    pub(super) token_file: Option<PathBuf>,
    pub(super) for_reads: bool,
    pub(super) admin_is_set: bool,
}

/// Checks the keys: one source of the token, a token long enough and of visible ASCII
/// characters only (it travels in a header), `admin_token_for_reads` only with a token.
pub(super) fn access(
    doc: &Document<'_>,
    keys: AdminKeys<'_>,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> Result<AdminAccess, ConfigError> {
    let (field, token) = match (keys.token, keys.token_file) {
        (Some(_), Some(_)) => {
            return Err(doc.error(
                "admin_token_file",
                "give the token once: `admin_token` or `admin_token_file`, not both",
            ));
        }
        (Some(token), None) => ("admin_token", token.to_owned()),
        (None, Some(file)) => {
            let path = resolve(file);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                doc.error(
                    "admin_token_file",
                    format_args!("cannot read {}: {e}", path.display()),
                )
            })?;
            ("admin_token_file", text.trim().to_owned())
        }
        (None, None) => {
            if keys.for_reads {
                return Err(doc.error(
                    "admin_token_for_reads",
                    "needs `admin_token` or `admin_token_file`: the token reads would need",
                ));
            }
            return Ok(AdminAccess::default());
        }
    };
    if !keys.admin_is_set {
        return Err(doc.error(
            field,
            "is set but `admin` is not: there is no admin address to protect",
        ));
    }
    if token.len() < MIN_TOKEN_LEN {
        return Err(doc.error(
            field,
            format_args!(
                "expected a token of at least {MIN_TOKEN_LEN} characters, found {} (`openssl rand -hex 32` makes one)",
                token.len()
            ),
        ));
    }
    if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(doc.error(
            field,
            format_args!(
                "expected visible ASCII characters only (the token travels in an `Authorization` header), found {bad:?}"
            ),
        ));
    }
    Ok(AdminAccess {
        token: Some(AdminToken(token.into())),
        for_reads: keys.for_reads,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const BASE: &str = "listen = \"127.0.0.1:8080\"\nadmin = \"127.0.0.1:9901\"\n";
    const SERVICES: &str = "[services.orders]\n";

    fn access(extra: &str) -> Result<AdminAccess, ConfigError> {
        Config::parse(&format!("{BASE}{extra}{SERVICES}"), Path::new("gw.toml"))
            .map(|c| c.admin_access)
    }

    fn refusal(extra: &str) -> String {
        access(extra).unwrap_err().to_string()
    }

    #[test]
    fn the_token_keys_are_checked_at_their_field() {
        assert_eq!(access("").unwrap(), AdminAccess::default());
        let a = access("admin_token = \"0123456789abcdef0123\"\nadmin_token_for_reads = true\n")
            .unwrap();
        assert!(a.token.as_ref().unwrap().matches(b"0123456789abcdef0123"));
        assert!(a.for_reads);
        assert!(!format!("{a:?}").contains("0123456789"), "{a:?}");
        let short = refusal("admin_token = \"short\"\n");
        assert!(
            short.contains("gw.toml")
                && short.contains("admin_token")
                && short.contains("at least 16"),
            "{short}"
        );
        let spaced = refusal("admin_token = \"0123456789 abcdef0123\"\n");
        assert!(spaced.contains("visible ASCII"), "{spaced}");
        let both = refusal("admin_token = \"0123456789abcdef0123\"\nadmin_token_file = \"t\"\n");
        assert!(
            both.contains("admin_token_file") && both.contains("not both"),
            "{both}"
        );
        let reads = refusal("admin_token_for_reads = true\n");
        assert!(reads.contains("admin_token_for_reads"), "{reads}");
        let no_admin = Config::parse(
            "listen = \"127.0.0.1:8080\"\nadmin_token = \"0123456789abcdef0123\"\n[services.orders]\n",
            Path::new("gw.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(no_admin.contains("no admin address"), "{no_admin}");
    }

    #[test]
    fn a_token_file_is_read_and_trimmed() {
        let dir = gray_test_support::TempDir::new("admin-token");
        std::fs::write(dir.path().join("token"), "0123456789abcdef0123\n").unwrap();
        let config = dir.path().join("gw.toml");
        let text = format!("{BASE}admin_token_file = \"token\"\n{SERVICES}");
        let a = Config::parse(&text, &config).unwrap().admin_access;
        assert!(a.token.unwrap().matches(b"0123456789abcdef0123"));
        let missing = Config::parse(
            &format!("{BASE}admin_token_file = \"absent\"\n{SERVICES}"),
            &config,
        )
        .unwrap_err()
        .to_string();
        assert!(
            missing.contains("admin_token_file") && missing.contains("absent"),
            "{missing}"
        );
    }

    #[test]
    fn a_token_matches_only_itself() {
        let token = AdminToken("0123456789abcdef".into());
        assert!(token.matches(b"0123456789abcdef"));
        assert!(!token.matches(b"0123456789abcdeF"));
        assert!(!token.matches(b"0123456789abcde"));
        assert!(!token.matches(b"0123456789abcdef0"));
        assert!(!token.matches(b""));
        assert_eq!(format!("{token:?}"), "AdminToken(<redacted>)");
    }
}
