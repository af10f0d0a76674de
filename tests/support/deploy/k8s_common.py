"""What the offline checks of zkguard's Kubernetes manifests share (k8s_check.py for
deploy/kubernetes/, tests/fleet/fleet_support/k8s_fleet_check.py for deploy/kubernetes-fleet/):
strict validation of a kustomization's manifests, the documents by kind and name, the
properties of the ConfigMap, and `zkguard config check` run on them with the Secret where the
pod would have it.
"""

import json
import os
import subprocess
import sys
import tempfile

import yaml


def fail(message):
    """Prints the failed check and exits 1."""
    print(f"FAIL: {message}")
    sys.exit(1)


class Manifests:
    """The manifests of the kustomization in `base`, validated strictly (kubernetes-validate),
    with the ConfigMap `config_name`, the Secret `zkguard` and the workload `kind`/`name`."""

    def __init__(self, base, config_name, kind, name):
        kustomization = yaml.safe_load(open(os.path.join(base, "kustomization.yaml")))
        files = [os.path.join(base, f) for f in kustomization["resources"]]
        validated = subprocess.run(
            ["kubernetes-validate", "--strict", *files], capture_output=True, text=True
        )
        if validated.returncode != 0:
            fail(f"kubernetes-validate: {validated.stdout}{validated.stderr}")
        print(f"ok: {len(files)} manifests validate strictly")
        self.docs = {}
        for f in files:
            for doc in yaml.safe_load_all(open(f)):
                self.docs[(doc["kind"], doc["metadata"]["name"])] = doc
        self.config = self.docs[("ConfigMap", config_name)]
        self.secret = self.docs[("Secret", "zkguard")]
        self.workload = self.docs[(kind, name)]
        self.pod = self.workload["spec"]["template"]["spec"]
        self.container = self.pod["containers"][0]
        self.mounts = {m["name"]: m for m in self.container["volumeMounts"]}
        self.volumes = {v["name"]: v for v in self.pod["volumes"]}
        self.properties_text = self.config["data"]["zkguard.properties"]
        self.props = {}
        for line in self.properties_text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                self.props[key.strip()] = value.strip()

    def config_check(self, binary, moved=()):
        """`zkguard config check` on the ConfigMap's properties, the Secret's files in a
        temporary directory where the pod mounts them; `moved` are more paths of the pod moved
        into that directory."""
        secret_dir = self.mounts["secret"]["mountPath"]
        with tempfile.TemporaryDirectory() as tmp:
            for key, value in self.secret["stringData"].items():
                with open(os.path.join(tmp, key), "w") as out:
                    out.write(value)
            text = self.properties_text.replace(secret_dir, tmp)
            for path in moved:
                text = text.replace(path, tmp)
            with open(os.path.join(tmp, "zkguard.properties"), "w") as out:
                out.write(text)
            checked = subprocess.run(
                [binary, "--config", os.path.join(tmp, "zkguard.properties"), "config", "check", "--json"],
                capture_output=True,
                text=True,
                env={k: v for k, v in os.environ.items() if not k.startswith("ZKGUARD_")},
            )
            if checked.returncode != 0:
                fail(f"zkguard config check: {checked.stdout}{checked.stderr}")
            answer = json.loads(checked.stdout)
            if answer.get("valid") is not True:
                fail(f"zkguard config check: {answer}")
