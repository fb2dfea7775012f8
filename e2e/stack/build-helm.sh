#!/usr/bin/env bash
# Builds the helm CLI $HELM_VERSION from helm.sh/helm/v3 through the Go module proxy
# (there is no other download path on our machines). Cached under $OXBOW_CACHE/helm.
source "$(dirname "$0")/lib.sh"
need go "install Go (https://go.dev) or the golang-go Debian package"

# Helm's Makefile stamps the Kubernetes version its client libraries speak (1.34 for
# v3.19); without it `helm template` and `helm lint` assume v1.20 and refuse our chart's
# kubeVersion. The stamp file notes that this build carries it.
k8s_minor=34
bin="$OXBOW_CACHE/helm/$HELM_VERSION/bin"
stamp="$bin/.built-with-k8s-1.$k8s_minor"
if [[ -x "$bin/helm" && -f "$stamp" ]] && grep -q "$HELM_VERSION" <<<"$("$bin/helm" version --short 2>/dev/null)"; then
  exit 0
fi
mkdir -p "$bin"
log "building helm $HELM_VERSION (go install, cached in $bin)"
GOBIN="$bin.tmp" CGO_ENABLED=0 go install -trimpath \
  -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" || die "failed to build helm $HELM_VERSION"
mv "$bin.tmp/helm" "$bin/helm"
rmdir "$bin.tmp"
touch "$stamp"
"$bin/helm" version --short
