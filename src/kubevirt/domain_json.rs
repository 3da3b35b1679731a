//! KubeVirt's `api.Domain` as JSON (what `GetDomain` returns and notify sends).
