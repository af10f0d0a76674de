"""Checks deploy/kubernetes-fleet/ offline, as tests/fleet/main.rs runs it:

1. every manifest of its kustomization validates strictly against the Kubernetes API schemas
   (kubernetes-validate);
2. the ConfigMap's zkguard.properties passes `zkguard config check` with the Secret's files
   where the pod mounts them, and puts the journal on Kafka;
3. the pods keep nothing of their own: a Deployment, no volume claim, state.dir on an emptyDir;
   the probes ask routes of the service on the API port, the container's ports are the ones the
   properties listen on, the config and secret files are mounted where they are named, and the
   termination grace period covers the drain plus the releases.

Usage: k8s_fleet_check.py REPO ZKGUARD_BINARY. Prints one line per check; exits 1 on the first
failure, naming it.
"""

import json
import os
import subprocess
import sys
import tempfile

import yaml

repo, binary = sys.argv[1], sys.argv[2]
base = os.path.join(repo, "deploy", "kubernetes-fleet")
sys.path.insert(0, os.path.join(repo, "tests", "support", "deploy"))
from k8s_common import Manifests, fail  # noqa: E402

m = Manifests(base, "zkguard-fleet", "Deployment", "zkguard-fleet")
docs, config, secret, deployment, pod = m.docs, m.config, m.secret, m.workload, m.pod
container, mounts, volumes = m.container, m.mounts, m.volumes
properties_text, props = m.properties_text, m.props
secret_dir = mounts["secret"]["mountPath"]
m.config_check(binary, moved=["/var/lib/zkguard"])
if props.get("server.journal.backend") != "kafka":
    fail("server.journal.backend is not kafka")
for key in ["server.journal.kafka.brokers", "server.journal.kafka.topic"]:
    if not props.get(key):
        fail(f"{key} is not set")
print("ok: the ConfigMap's zkguard.properties passes zkguard config check and puts the journal on Kafka")

if "volumeClaimTemplates" in deployment["spec"]:
    fail("the Deployment has volume claim templates")
for name, volume in volumes.items():
    if "persistentVolumeClaim" in volume:
        fail(f"volume {name} is a persistent volume claim: the pods must keep nothing of their own")
state = props["state.dir"]
scratch = [m for m in container["volumeMounts"] if m["mountPath"] == state]
if not scratch or "emptyDir" not in volumes[scratch[0]["name"]]:
    fail(f"state.dir {state} is not on an emptyDir")
if deployment["spec"]["replicas"] < 3:
    fail("a fleet of fewer than 3 replicas")
print("ok: no pod has a volume of its own (a Deployment, state.dir on an emptyDir)")

ports = {p["name"]: p["containerPort"] for p in container["ports"]}
for name, key in [("api", "server.listen"), ("gateway", "server.gateway.listen")]:
    if int(props[key].rsplit(":", 1)[1]) != ports[name]:
        fail(f"container port {name} {ports[name]} is not the port of {key} ({props[key]})")
openapi = json.load(open(os.path.join(repo, "docs", "openapi.json")))
for probe in ["startupProbe", "livenessProbe", "readinessProbe"]:
    get = container[probe]["httpGet"]
    if get["path"] not in openapi["paths"] or get["port"] != "api":
        fail(f"{probe} asks {get['path']} on {get['port']}, not a route of the service's API port")
args = container["args"]
if mounts["config"]["mountPath"] != args[args.index("--config") + 1]:
    fail("the config is not mounted where the arguments name it")
for key, value in props.items():
    if value.startswith(secret_dir + "/") and value[len(secret_dir) + 1 :] not in secret["stringData"]:
        fail(f"{key} names {value}, which is not a key of the Secret")
drain = int(props.get("server.drain.timeout", "10000")) / 1000
if pod["terminationGracePeriodSeconds"] < drain + 10:
    fail("the termination grace period does not cover the drain and the releases")
print("ok: ports, probes, mounts and the grace period agree with the service")
