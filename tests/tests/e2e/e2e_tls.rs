//! HTTPS (spec section 18): `[server] tls_cert` / `tls_key` serve HTTPS with rustls. The test
//! makes its own CA and server certificates (rcgen), connects with a client that trusts only
//! that CA and checks the chain and the certificate served, then replaces the files and sees
//! the new certificate on new connections without a restart; a pair that does not load keeps
//! the previous one; a start with a broken pair is refused before the log is opened.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tokio::io::AsyncBufReadExt;

use crate::common::refused_start;

const HOST: &str = "tidemark.test";

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: Vec<u8>,
}

fn ca() -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "tidemark test CA");
    let key = KeyPair::generate().expect("key");
    let cert = params.self_signed(&key).expect("CA certificate");
    Ca {
        der: cert.der().to_vec(),
        issuer: Issuer::new(params, key),
    }
}

/// A server certificate for [`HOST`] signed by `ca`: (chain PEM, key PEM, leaf DER).
fn leaf(ca: &Ca, name: &str) -> (String, String, Vec<u8>) {
    let mut params =
        CertificateParams::new(vec![HOST.to_owned(), "127.0.0.1".to_owned()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = params
        .signed_by(&key, &ca.issuer)
        .expect("leaf certificate");
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

/// Replace `path` with `text` at once (write beside, then rename).
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

struct TlsServer {
    child: tokio::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn start(cert: &Path, key: &Path) -> TlsServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ntls_cert = {:?}\ntls_key = {:?}\n",
            cert.display().to_string(),
            key.display().to_string()
        ),
    )
    .expect("config");
    let data = dir.path().join("data");
    let mut cmd = tidemark_tests::cli_command(
        None,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            data.to_str().expect("utf-8"),
            "--config",
            config.to_str().expect("utf-8"),
        ],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("spawn the server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .expect("the server printed its address")
        .expect("read stdout")
        .expect("a first line");
    let addr = first
        .strip_prefix("listening on https://")
        .unwrap_or_else(|| panic!("first line {first:?}: not https"))
        .parse()
        .expect("an address");
    // Keep draining stdout so the server never blocks on it.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    TlsServer {
        child,
        addr,
        _dir: dir,
    }
}

/// A client that trusts only `ca`. A new one for each look at the certificate: a client's TLS
/// session cache resumes a session without a certificate being presented again.
fn client(ca: &Ca, addr: SocketAddr) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_der(&ca.der).expect("CA"))
        .tls_info(true)
        .resolve(HOST, addr)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// The certificate the server presented for a new connection, after a 200 from `/livez`.
async fn served(c: &reqwest::Client, addr: SocketAddr) -> Vec<u8> {
    let r = c
        .get(format!("https://{HOST}:{}/livez", addr.port()))
        .send()
        .await
        .expect("an HTTPS request the client's CA verifies");
    assert_eq!(r.status(), reqwest::StatusCode::OK);
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("the peer certificate")
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_certificate_reloaded_without_a_restart() {
    let ca = ca();
    let files = tempfile::tempdir().expect("tempdir");
    let (cert, key): (PathBuf, PathBuf) =
        (files.path().join("cert.pem"), files.path().join("key.pem"));
    let (pem1, key1, der1) = leaf(&ca, "first");
    replace(&cert, &pem1);
    replace(&key, &key1);
    let mut s = start(&cert, &key).await;
    let pid = s.child.id();
    let c = client(&ca, s.addr);
    assert_eq!(served(&c, s.addr).await, der1, "the configured certificate");
    // The API itself over HTTPS.
    let r = c
        .post(format!("https://{HOST}:{}/v1/events", s.addr.port()))
        .json(&serde_json::json!({"stream": "tls", "type": "tls.hello"}))
        .send()
        .await
        .expect("append over HTTPS");
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    // A client that does not trust the CA refuses the chain.
    let stranger = reqwest::Client::builder()
        .resolve(HOST, s.addr)
        .build()
        .expect("client");
    let e = stranger
        .get(format!("https://{HOST}:{}/livez", s.addr.port()))
        .send()
        .await
        .expect_err("an untrusted chain");
    assert!(e.is_connect(), "{e:?}");
    // Plain HTTP on the HTTPS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://{}/livez", s.addr))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    assert!(
        plain.as_ref().map_or(true, |r| !r.status().is_success()),
        "{plain:?}"
    );

    // New files: new connections get the new certificate, from the same process.
    let (pem2, key2, der2) = leaf(&ca, "second");
    replace(&key, &key2);
    replace(&cert, &pem2);
    let mut seen = Vec::new();
    for _ in 0..300 {
        seen = served(&client(&ca, s.addr), s.addr).await;
        if seen == der2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, der2, "the replaced certificate was not picked up");
    assert_eq!(s.child.id(), pid, "no restart");

    // A pair that does not load (a key of another certificate) keeps the one in use.
    let (_, key3, _) = leaf(&ca, "third");
    replace(&key, &key3);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for _ in 0..3 {
        assert_eq!(
            served(&client(&ca, s.addr), s.addr).await,
            der2,
            "a broken pair replaced a good one"
        );
    }
    s.child.start_kill().expect("kill");
    let _ = s.child.wait().await;
}

#[test]
fn a_start_with_a_broken_pair_is_refused() {
    let ca = ca();
    let files = tempfile::tempdir().expect("tempdir");
    let (cert, key) = (files.path().join("cert.pem"), files.path().join("key.pem"));
    let (pem1, _, _) = leaf(&ca, "first");
    let (_, other_key, _) = leaf(&ca, "other");
    std::fs::write(&cert, pem1).expect("write");
    std::fs::write(&key, other_key).expect("write");
    let toml = |c: &Path, k: &Path| {
        format!(
            "[server]\ntls_cert = {:?}\ntls_key = {:?}\n",
            c.display().to_string(),
            k.display().to_string()
        )
    };
    let e = refused_start(&toml(&cert, &key), &[]);
    assert!(e.contains("do not belong together"), "{e}");
    let e = refused_start(&toml(&cert, &files.path().join("missing.pem")), &[]);
    assert!(e.contains("tls_key"), "{e}");
    let e = refused_start(
        &format!("[server]\ntls_cert = {:?}\n", cert.display().to_string()),
        &[],
    );
    assert!(e.contains("tls_cert and server.tls_key go together"), "{e}");
    // No key material in what it says.
    assert!(!e.contains("PRIVATE KEY"), "{e}");
}
