"""Checks deploy/kubernetes/ offline, as tests/cli/deploy_kubernetes.rs runs it:

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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k8s_common import Manifests, fail  # noqa: E402

m = Manifests(base, "zkguard", "StatefulSet", "zkguard")
docs, config, secret, sts, pod = m.docs, m.config, m.secret, m.workload, m.pod
container, mounts, volumes = m.container, m.mounts, m.volumes
properties_text, props = m.properties_text, m.props
secret_dir = mounts["secret"]["mountPath"]
m.config_check(binary)
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

# 4. The image, the manifests, the unit and the references agree.


def dockerfile_instructions(path):
    """(INSTRUCTION, arguments) of the last stage of a Dockerfile, continuation lines joined."""
    lines, current = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    stages = []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word.upper(), rest.strip()))
    return stages[-1]


def option(command, name):
    """The value after `name` in a shell command (`--uid 10001`)."""
    words = command.split()
    return words[words.index(name) + 1] if name in words else None


image = dockerfile_instructions(os.path.join(repo, "docker", "Dockerfile"))
runs = " && ".join(a for i, a in image if i == "RUN")
if "useradd " not in runs or "groupadd " not in runs:
    fail("the image creates no user and group with fixed ids (groupadd --gid, useradd --uid --gid)")
useradd = runs[runs.index("useradd "):].split("&&")[0]
groupadd = runs[runs.index("groupadd "):].split("&&")[0]
uid, gid = option(useradd, "--uid"), option(useradd, "--gid")
if uid is None or gid is None or option(groupadd, "--gid") != gid:
    fail(f"the image's user has no fixed uid and gid: {useradd} / {groupadd}")
image_user = [a for i, a in image if i == "USER"]
if image_user != [f"{uid}:{gid}"]:
    fail(f"the image's USER {image_user} is not its user {uid}:{gid}")
security = pod["securityContext"]
for key, want in [("runAsUser", uid), ("runAsGroup", gid), ("fsGroup", gid)]:
    if str(security.get(key)) != want:
        fail(f"the pods' {key} {security.get(key)} is not the image's {want} (useradd/groupadd in docker/Dockerfile)")
print(f"ok: the pods run as the image's user and group ({uid}:{gid})")

reference = {}
for line in open(os.path.join(repo, "docs", "reference", "config.md")):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 4 and cells[0].startswith("`") and cells[3].startswith("`ZKGUARD_"):
        reference[cells[0].strip("`")] = {"default": cells[1].strip("`"), "about": cells[2], "env": cells[3].strip("`")}
by_env = {v["env"]: k for k, v in reference.items()}
conf = {}
for line in open(os.path.join(repo, "conf", "zkguard.properties")):
    if "=" in line and not line.lstrip().startswith("#"):
        key, _, value = line.partition("=")
        conf[key.strip()] = value.strip()
exposed = sorted(int(p) for i, a in image if i == "EXPOSE" for p in a.split())
if exposed != sorted(ports.values()):
    fail(f"the image exposes {exposed}, the pods' ports are {ports}")
for name, port in [("reference default of server.listen", reference["server.listen"]["default"]),
                   ("conf/zkguard.properties' server.listen", conf["server.listen"])]:
    if int(port.rsplit(":", 1)[1]) != ports["api"]:
        fail(f"the {name} ({port}) is not on the API port {ports['api']}")
print(f"ok: the image, the pods and the configuration use the same ports {exposed}")

routes = open(os.path.join(repo, "docs", "reference", "http.md")).read()
for probe in ["startupProbe", "livenessProbe", "readinessProbe"]:
    path = container[probe]["httpGet"]["path"]
    if f"| `{path}` |" not in routes:
        fail(f"{probe} asks {path}, which docs/reference/http.md does not list")
print("ok: the probes' paths are routes of docs/reference/http.md")

unit = {}
for line in open(os.path.join(repo, "deploy", "systemd", "zkguard.service")):
    line = line.strip()
    if "=" in line and not line.startswith(("#", "[")):
        key, _, value = line.partition("=")
        unit.setdefault(key, []).append(value)
unit_env = dict(e.split("=", 1) for e in unit.get("Environment", []))
for var in unit_env:
    if var not in by_env:
        fail(f"the unit sets {var}, which is no key's variable in docs/reference/config.md")
exec_start = unit["ExecStart"][0].split()
image_env = dict(a.split("=", 1) for i, a in image if i == "ENV")
config_paths = {
    "the image's ZKGUARD_CONFIG": image_env.get("ZKGUARD_CONFIG"),
    "the pods' --config": config_path,
    "the unit's --config": exec_start[exec_start.index("--config") + 1],
}
if len(set(config_paths.values())) != 1:
    fail(f"the configuration file differs: {config_paths}")
config_dir = os.path.dirname(config_path)
copies = [a.split() for i, a in image if i == "COPY"]
if ["conf/", config_dir + "/"] not in copies:
    fail(f"the image does not copy conf/ to {config_dir}/: {copies}")
if f"/etc/{unit['ConfigurationDirectory'][0]}" != config_dir:
    fail(f"the unit's ConfigurationDirectory is not {config_dir}")
print(f"ok: the image, the pods and the unit read {config_path}")

home = option(useradd, "--home-dir")
state_dirs = {
    "the image user's home": home,
    "the image's WORKDIR": [a for i, a in image if i == "WORKDIR"][-1],
    "the pods' journal volume": journal_dir,
    "the ConfigMap's state.dir": props["state.dir"],
    "the unit's StateDirectory": "/var/lib/" + unit["StateDirectory"][0],
    "the unit's state.dir": unit_env.get(reference["state.dir"]["env"]),
}
if len(set(state_dirs.values())) != 1:
    fail(f"the state directory differs: {state_dirs}")
if home not in reference["state.dir"]["about"]:
    fail(f"docs/reference/config.md does not name {home} as the state directory's fallback")
print(f"ok: the image, the pods and the unit keep their state in {home}")

credentials = dict(c.split(":", 1) for c in unit.get("LoadCredential", []))
if not credentials:
    fail("the unit loads no credential: its secrets would have to be readable by its dynamic user")
pointed = {}
for var, value in unit_env.items():
    if value.startswith("%d/"):
        key = by_env[var]
        if not key.endswith(".file") or "holding secrets" not in open(os.path.join(repo, "docs", "reference", "config.md")).read().split(f"| `{key}` |")[1].split("\n")[0]:
            fail(f"{var} points into the credentials directory but {key} is not a secret file's key")
        pointed[value[3:]] = key
for cred, source in credentials.items():
    if cred not in pointed:
        fail(f"the unit loads the credential {cred} but no key points at %d/{cred}")
    if os.path.dirname(source) != config_dir:
        fail(f"the credential {cred} comes from {source}, outside {config_dir}")
for cred in pointed:
    if cred not in credentials:
        fail(f"the unit points {pointed[cred]} at %d/{cred}, a credential it does not load")
if not secret_dir.startswith(config_dir + "/"):
    fail(f"the pods' secrets ({secret_dir}) are not under {config_dir}")
secret_keys = sorted(k for k, v in props.items() if v.startswith(secret_dir + "/"))
if not set(pointed.values()) <= set(secret_keys):
    fail(f"the unit's secret keys {sorted(pointed.values())} are not among the pods' {secret_keys}")
print(f"ok: the unit's secrets are credentials in {config_dir}, named like the pods' ({', '.join(sorted(pointed.values()))})")
