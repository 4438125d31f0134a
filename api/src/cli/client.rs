//! The CLI's client of the API: the `tidemark-client` crate (`clients/rust`), which holds the
//! base URL (`--url`, also without a scheme), the bearer token and the transport; this module
//! turns its answers into records or a [`CliError`].

use super::ClientArgs;
use super::error::CliError;

/// A client of one server.
pub(crate) struct Client {
    api: tidemark_client::Client,
    /// The server's base URL without a trailing slash, e.g. `http://127.0.0.1:7700`.
    pub base: String,
}

impl Client {
    pub(crate) fn new(args: &ClientArgs) -> Result<Client, CliError> {
        let mut base = base_url(&args.url)?;
        if let Some(t) = &args.tenant {
            tidemark_log::check_tenant(t)
                .map_err(|e| CliError::Other(format!("--tenant {t:?} cannot be used: {e}")))?;
            base = format!("{base}/tenants/{t}");
        }
        let api = tidemark_client::Client::new(base.clone(), args.token.clone()).map_err(|e| {
            CliError::Other(match e {
                tidemark_client::Error::Config(why) => why,
                e => e.to_string(),
            })
        })?;
        Ok(Client { api, base })
    }

    /// The API's operations (the crate's generated calls) answering the server's JSON as sent,
    /// each through [`Client::op`].
    pub(crate) fn ops(&self) -> tidemark_client::Ops<'_, tidemark_client::AsJson> {
        self.api.ops_json()
    }

    /// A live stream of the log (the crate's, which resumes across restarts of the server).
    pub(crate) fn stream(
        &self,
        opts: tidemark_client::StreamOptions,
    ) -> tidemark_client::EventStream {
        self.api.stream(opts)
    }

    /// A running server's backup stream.
    pub(crate) fn backup_stream(
        &self,
        shard: Option<u32>,
        after: u64,
    ) -> impl std::future::Future<
        Output = Result<tidemark_client::BackupStream, tidemark_client::Error>,
    > + '_ {
        self.api.backup_stream_of(shard, after)
    }

    /// A call's answer, or its failure as the CLI reports it.
    pub(crate) async fn op<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, tidemark_client::Error>>,
    ) -> Result<T, CliError> {
        call.await.map_err(|e| self.failed(e))
    }

    /// A failure of the client as the CLI reports it: the server's problem, or the server
    /// not reached (named by its URL).
    pub(crate) fn failed(&self, e: tidemark_client::Error) -> CliError {
        match e {
            tidemark_client::Error::Api(p) => CliError::refused(p.status, p.body.to_string()),
            tidemark_client::Error::Transport(e) => self.unreachable(&e),
            e => CliError::Other(e.to_string()),
        }
    }

    /// Why no answer came from the server, in words.
    pub(crate) fn unreachable(&self, e: &reqwest::Error) -> CliError {
        let mut cause: &dyn std::error::Error = e;
        let mut refused = false;
        while let Some(inner) = cause.source() {
            if let Some(io) = inner.downcast_ref::<std::io::Error>() {
                refused |= io.kind() == std::io::ErrorKind::ConnectionRefused;
            }
            cause = inner;
        }
        let cause = if e.is_timeout() {
            "no answer in time".to_owned()
        } else {
            cause.to_string()
        };
        CliError::Unreachable {
            url: self.base.clone(),
            cause,
            refused,
        }
    }
}

/// The server's base URL from `--url`: `host:port` alone (`127.0.0.1:7700`, `localhost:7700`,
/// `[::1]:7700`) means `http://host:port`; otherwise an http or https URL with a host and no
/// query. The answer has no trailing slash.
pub(crate) fn base_url(given: &str) -> Result<String, String> {
    let given = given.trim();
    let bad = |why: &str| {
        format!(
            "--url {given:?} cannot be used: {why} (give the server's address, e.g. \
             http://127.0.0.1:7700 or 127.0.0.1:7700)"
        )
    };
    if given.is_empty() {
        return Err(bad("it is empty"));
    }
    let with_scheme = if given.contains("://") {
        given.to_owned()
    } else {
        format!("http://{given}")
    };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| bad(&e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(&format!(
            "the scheme is {:?}; the server speaks http or https",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("it names no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("a base URL has no query or fragment"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("pass credentials with --token, not in the URL"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_without_a_scheme_is_http() {
        for (given, want) in [
            ("127.0.0.1:7861", "http://127.0.0.1:7861"),
            ("localhost:7700", "http://localhost:7700"),
            ("[::1]:7700", "http://[::1]:7700"),
            ("http://127.0.0.1:7700/", "http://127.0.0.1:7700"),
            (
                "https://tidemark.example/base/",
                "https://tidemark.example/base",
            ),
            (" localhost:7700 ", "http://localhost:7700"),
        ] {
            assert_eq!(base_url(given).as_deref(), Ok(want), "{given}");
        }
    }

    #[test]
    fn an_unusable_url_is_explained() {
        for (given, why) in [
            ("ftp://x:1", "the scheme is \"ftp\""),
            ("127.0.0.1:notaport", "invalid port"),
            ("http://", "empty host"),
            ("", "it is empty"),
            ("http://h:1/?a=b", "no query"),
            ("http://u:p@h:1", "--token"),
        ] {
            let e = base_url(given).expect_err(given);
            assert!(
                e.contains(why) && e.contains("cannot be used"),
                "{given}: {e}"
            );
        }
    }
}
