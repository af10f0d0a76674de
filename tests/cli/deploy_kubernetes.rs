//! The Kubernetes manifests in `deploy/kubernetes/`, checked offline: valid against the
//! Kubernetes API schemas, their configuration accepted by `zkguard config check`, and
//! consistent with each other, with the service, with the container image (docker/Dockerfile),
//! the systemd unit and the configuration and HTTP references: user and group ids, ports, probe
//! paths, the configuration file, the state directory and the secret files
//! (tests/support/deploy/k8s_check.py).

use std::path::Path;
use std::process::Command;

#[test]
fn the_kubernetes_manifests_validate_and_agree_with_the_service() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(repo.join("tests/support/deploy/k8s_check.py"))
        .arg(repo)
        .arg(env!("CARGO_BIN_EXE_zkguard"))
        .output()
        .expect("python3");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !said.contains("No module named") && !said.contains("kubernetes-validate: not found"),
        "kubernetes-validate or PyYAML is missing: run `make deps`\n{said}"
    );
    assert!(out.status.success(), "{said}");
    assert_eq!(
        said.lines().filter(|l| l.starts_with("ok: ")).count(),
        13,
        "{said}"
    );
}
