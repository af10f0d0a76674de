//! A throwaway certificate authority for the TLS tests, made with the `openssl` command.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA (key and certificate) in a directory, issuing certificates for `127.0.0.1`/`localhost`.
pub struct Ca {
    dir: PathBuf,
    name: String,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl (run scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Ca {
    /// A new CA named `name` (files `name-ca.pem`, `name-ca.key` in `dir`).
    pub fn new(dir: &Path, name: &str) -> Self {
        let (cert, key) = (format!("{name}-ca.pem"), format!("{name}-ca.key"));
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &cert,
                "-days",
                "2",
                "-subj",
                &format!("/CN={name} test CA"),
            ],
        );
        Self {
            dir: dir.to_path_buf(),
            name: name.to_string(),
        }
    }

    /// The CA certificate (PEM).
    pub fn cert(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// A certificate for `127.0.0.1` and `localhost` (server and client use) signed by this CA:
    /// the paths of the certificate and of its private key (PKCS#8 PEM).
    pub fn issue(&self, leaf: &str) -> (PathBuf, PathBuf) {
        let (cert, key, csr, ext) = (
            format!("{leaf}.pem"),
            format!("{leaf}.key"),
            format!("{leaf}.csr"),
            format!("{leaf}.ext"),
        );
        std::fs::write(
            self.dir.join(&ext),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={leaf}"),
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &format!("{}-ca.pem", self.name),
                "-CAkey",
                &format!("{}-ca.key", self.name),
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        (self.dir.join(cert), self.dir.join(key))
    }
}
