#!/usr/bin/env bash
# What deploy/ ships, checked offline (CI runs this after the tests):
#
# 1. the chart (deploy/chart/moat) renders to exactly what deploy/k8s holds,
#    with its defaults and with ci/native-nodes-values.yaml;
# 2. the rendered manifests validate against the Kubernetes API schemas
#    (kubernetes-validate, strict: no unknown field);
# 3. checkov (a static security policy checker) finds nothing; each check
#    the chart skips says why in an annotation of the object it skips;
# 4. each pod's grace period covers Moat's drain ([serve] drain_timeout_ms
#    in the config the chart gives it) with 5 s to spare;
# 5. the HAProxy config the chart renders is one HAProxy accepts;
# 6. the container image builds from deploy/container/Containerfile with
#    buildah, its `moat --version` runs as uid 65532, and it holds nothing
#    but the binary, the shared objects ldd says the binary loads and the
#    CA certificates; Moat's directories in it belong to uid 65532.
#
# Installs what it needs (as root, from Debian's packages and PyPI, pinned,
# into target/deploy-py). With --render, writes deploy/k8s/ afresh
# instead of checking it.
#
# usage: bash deploy/check.sh [--render] [BINARY]   (BINARY: target/debug/moat)
set -euo pipefail
cd "$(dirname "$0")/.."

render_only=false
if [ "${1:-}" = --render ]; then
    render_only=true
    shift
fi
binary=${1:-target/debug/moat}

need_debian() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} = 0 ] && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "deploy/check.sh: needs Debian's ${missing[*]}" >&2
        exit 1
    fi
}

# The renderer: Go's text/template with sprig, as Helm uses them (Helm
# itself is in none of the registries this project builds from).
need_debian golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev
render() {
    GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$PWD/target/go-cache" \
        go run deploy/render/main.go deploy/chart/moat moat moat "$@"
}
if $render_only; then
    render >deploy/k8s/moat.yaml
    render deploy/chart/moat/ci/native-nodes-values.yaml >deploy/k8s/moat-native-nodes.yaml
    echo "deploy/k8s/ rendered afresh"
    exit 0
fi

echo "1. the chart renders to deploy/k8s/"
stale=false
diff -u deploy/k8s/moat.yaml <(render) || stale=true
diff -u deploy/k8s/moat-native-nodes.yaml <(render deploy/chart/moat/ci/native-nodes-values.yaml) || stale=true
if $stale; then
    echo "deploy/check.sh: deploy/k8s/ is not what the chart renders: run bash deploy/check.sh --render" >&2
    exit 1
fi

KUBERNETES_VALIDATE=1.37.0
CHECKOV=3.3.30
if ! PYTHONPATH=target/deploy-py python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('kubernetes-validate') != '$KUBERNETES_VALIDATE' or m.version('checkov') != '$CHECKOV')" 2>/dev/null; then
    python3 -m pip install --quiet --disable-pip-version-check --target target/deploy-py --upgrade \
        "kubernetes-validate==$KUBERNETES_VALIDATE" "checkov==$CHECKOV" 2>&1 |
        grep -v -e "dependency conflicts" -e "requires .* but you have" -e "Running pip as the 'root' user" || true
fi
deploy_py() { PYTHONPATH="$PWD/target/deploy-py" python3 "$@"; }

echo "2. the manifests against the Kubernetes 1.33 API schemas"
deploy_py -m kubernetes_validate --strict --quiet -k 1.33.0 deploy/k8s/moat.yaml deploy/k8s/moat-native-nodes.yaml

echo "3. checkov"
deploy_py -m checkov.main --framework kubernetes --compact --quiet --skip-download \
    -f deploy/k8s/moat.yaml -f deploy/k8s/moat-native-nodes.yaml

echo "4. the fronts' grace period covers their drain"
deploy_py - deploy/k8s/moat.yaml deploy/k8s/moat-native-nodes.yaml <<'PY'
import sys, tomllib, yaml
for path in sys.argv[1:]:
    documents = [d for d in yaml.safe_load_all(open(path)) if d]
    for kind, part in [("StatefulSet", "front"), ("StatefulSet", "node")]:
        workload = next(d for d in documents if d["kind"] == kind and d["metadata"]["name"].endswith("-" + part))
        config = next(d for d in documents if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-" + part))
        drain_ms = tomllib.loads(config["data"]["moat.toml"]).get("serve", {}).get("drain_timeout_ms", 30000)
        grace = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        if grace * 1000 < drain_ms + 5000:
            sys.exit(f"{path}: {part}: terminationGracePeriodSeconds {grace} leaves less than 5 s beyond [serve] drain_timeout_ms {drain_ms}")
PY

echo "5. the rendered HAProxy config"
need_debian haproxy
haproxy_cfg=$(mktemp)
trap 'rm -f "$haproxy_cfg"' EXIT
deploy_py - deploy/k8s/moat.yaml >"$haproxy_cfg" <<'PY'
import sys, yaml
for document in yaml.safe_load_all(open(sys.argv[1])):
    if document and document["kind"] == "ConfigMap" and document["metadata"]["name"].endswith("-haproxy"):
        sys.stdout.write(document["data"]["haproxy.cfg"])
PY
MOAT_LB_BIND=:8080 haproxy -c -q -f "$haproxy_cfg"

echo "6. the container image"
need_debian buildah
context=target/image
bash deploy/container/stage.sh "$binary" "$context" >/dev/null
buildah="buildah --storage-driver vfs"
$buildah build --quiet --isolation chroot -f deploy/container/Containerfile -t localhost/moat:check "$context" >/dev/null
container=$($buildah from localhost/moat:check)
trap 'rm -f "$haproxy_cfg"; $buildah rm "$container" >/dev/null 2>&1 || true' EXIT
# What the image holds (read before anything runs in it, which would add
# the runtime's mount points).
mounted=$($buildah mount "$container")
held=$(cd "$mounted" && find . -mindepth 1 \( -type f -o -type l \) | sed 's#^\.##' | sort)
owners=$(cd "$mounted" && stat -c '%u:%g %n' var/cache/moat var/lib/moat)
$buildah umount "$container" >/dev/null
needed=$( (echo /usr/local/bin/moat; echo /etc/ssl/certs/ca-certificates.crt; ldd "$binary" | awk '/=> \// { print $3 } /^\t\// { print $1 }') | sort)
if [ "$held" != "$needed" ]; then
    echo "deploy/check.sh: the image holds other files than the binary and what it loads:" >&2
    diff <(echo "$needed") <(echo "$held") >&2 || true
    exit 1
fi
if [ "$(echo "$owners" | cut -d' ' -f1 | sort -u)" != "65532:65532" ]; then
    echo "deploy/check.sh: Moat's directories in the image are not its user's: $owners" >&2
    exit 1
fi
version=$($buildah run --isolation chroot --user 65532:65532 "$container" -- /usr/local/bin/moat --version)
expected=$("$binary" --version)
if [ "$version" != "$expected" ]; then
    echo "deploy/check.sh: the image's moat --version said '$version', not '$expected'" >&2
    exit 1
fi
echo "   image: $(echo "$held" | wc -l) files ($(echo "$held" | tr '\n' ' ')); $version"
echo "deploy/check.sh: all checks passed"
