"""Checks deploy/kubernetes/ offline, as tests/deploy_kubernetes.rs runs it:

1. every manifest validates strictly against the Kubernetes API schemas (kubernetes-validate);
2. the ConfigMap's zkguard.properties passes `zkguard config check` with the Secret's files
   where the pod mounts them (paths moved into a temporary directory);
3. the manifests agree with each other and with the service: the container's ports are the
   ones the properties listen on, the probes' paths are routes of the OpenAPI document, the
   config file is mounted where the arguments name it, every secret file the properties name is
   a key of the Secret, the journal lives on the per-replica volume, and the termination grace
   period covers server.drain.timeout plus the releases after it.

Usage: k8s_check.py REPO ZKGUARD_BINARY. Prints one line per check; exits 1 on the first
failure, naming it.
"""

import json
import os
import subprocess
import sys
import tempfile

import yaml

repo, binary = sys.argv[1], sys.argv[2]
base = os.path.join(repo, "deploy", "kubernetes")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


kustomization = yaml.safe_load(open(os.path.join(base, "kustomization.yaml")))
files = [os.path.join(base, f) for f in kustomization["resources"]]
validated = subprocess.run(
    ["kubernetes-validate", "--strict", *files], capture_output=True, text=True
)
if validated.returncode != 0:
    fail(f"kubernetes-validate: {validated.stdout}{validated.stderr}")
print(f"ok: {len(files)} manifests validate strictly")

docs = {}
for f in files:
    for doc in yaml.safe_load_all(open(f)):
        docs[(doc["kind"], doc["metadata"]["name"])] = doc
config = docs[("ConfigMap", "zkguard")]
secret = docs[("Secret", "zkguard")]
sts = docs[("StatefulSet", "zkguard")]
pod = sts["spec"]["template"]["spec"]
container = pod["containers"][0]
mounts = {m["name"]: m for m in container["volumeMounts"]}
volumes = {v["name"]: v for v in pod["volumes"]}

properties_text = config["data"]["zkguard.properties"]
props = {}
for line in properties_text.splitlines():
    line = line.strip()
    if line and not line.startswith("#"):
        key, _, value = line.partition("=")
        props[key.strip()] = value.strip()

# 2. zkguard config check, with the Secret where the pod would have it.
secret_dir = mounts["secret"]["mountPath"]
with tempfile.TemporaryDirectory() as tmp:
    for key, value in secret["stringData"].items():
        with open(os.path.join(tmp, key), "w") as out:
            out.write(value)
    with open(os.path.join(tmp, "zkguard.properties"), "w") as out:
        out.write(properties_text.replace(secret_dir, tmp))
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
print("ok: the ConfigMap's zkguard.properties passes zkguard config check with the Secret")

# 3. The manifests agree with each other and with the service.
ports = {p["name"]: p["containerPort"] for p in container["ports"]}
for name, key in [("api", "server.listen"), ("gateway", "server.gateway.listen")]:
    if int(props[key].rsplit(":", 1)[1]) != ports[name]:
        fail(f"container port {name} {ports[name]} is not the port of {key} ({props[key]})")
print("ok: the container's ports are the ones the properties listen on")

openapi = json.load(open(os.path.join(repo, "docs", "openapi.json")))
for probe in ["startupProbe", "livenessProbe", "readinessProbe"]:
    get = container[probe]["httpGet"]
    if get["path"] not in openapi["paths"]:
        fail(f"{probe} asks {get['path']}, which is not a route of the service")
    if get["port"] != "api":
        fail(f"{probe} asks port {get['port']}, not the API's")
startup = container["startupProbe"]
if startup["periodSeconds"] * startup["failureThreshold"] < 120:
    fail("the startup probe allows less than 2 minutes for the journal's replay")
print("ok: the probes ask /healthz and /readyz, routes of the service, with room for a replay")

args = container["args"]
config_path = args[args.index("--config") + 1]
if mounts["config"]["mountPath"] != config_path:
    fail(f"the config is mounted at {mounts['config']['mountPath']}, the arguments name {config_path}")
if volumes["config"]["configMap"]["name"] != config["metadata"]["name"]:
    fail("the config volume is not the ConfigMap")
for key, value in props.items():
    if value.startswith(secret_dir + "/"):
        name = value[len(secret_dir) + 1 :]
        if name not in secret["stringData"]:
            fail(f"{key} names {value}, which is not a key of the Secret")
print("ok: the config and every secret file the properties name are mounted where they are named")

journal_dir = mounts["journal"]["mountPath"]
templates = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
if "journal" not in templates:
    fail("the journal volume is not a per-replica volume claim")
for key in ["server.journal.path", "state.dir"]:
    if not props[key].startswith(journal_dir):
        fail(f"{key} ({props[key]}) is not on the journal volume ({journal_dir})")
print("ok: each replica's journal is on its own volume")

drain = int(props.get("server.drain.timeout", "10000")) / 1000
if pod["terminationGracePeriodSeconds"] < drain + 10:
    fail(f"terminationGracePeriodSeconds {pod['terminationGracePeriodSeconds']} < server.drain.timeout {drain}s + 10s of releases")
print("ok: the termination grace period covers the drain and the releases")
