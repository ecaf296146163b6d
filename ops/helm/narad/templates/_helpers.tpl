{{/* Names and labels. */}}

{{- define "narad.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "narad.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The headless Service: it names the pods for each other. */}}
{{- define "narad.headless" -}}
{{- printf "%s-headless" (include "narad.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "narad.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "narad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "narad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "narad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "narad.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Secret names, defaulted from the release. */}}
{{- define "narad.adminSecret" -}}
{{- default (printf "%s-admin" (include "narad.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "narad.peerSecret" -}}
{{- default (printf "%s-peer" (include "narad.fullname" .)) .Values.peerTrust.existingSecret -}}
{{- end -}}

{{/* The full DNS name of pod number $i: NAME-i.HEADLESS.NAMESPACE.svc.DOMAIN */}}
{{- define "narad.podHost" -}}
{{- $root := index . 0 -}}
{{- $i := index . 1 -}}
{{- printf "%s-%d.%s.%s.svc.%s" (include "narad.fullname" $root) (int $i) (include "narad.headless" $root) $root.Release.Namespace $root.Values.clusterDomain -}}
{{- end -}}

{{/* `peers`: the initial members, node id = pod ordinal + 1. */}}
{{- define "narad.peers" -}}
{{- $root := . -}}
{{- $members := list -}}
{{- range $i := until (int .Values.initialMembers) -}}
{{- $members = append $members (printf "%d=%s:%d" (add $i 1) (include "narad.podHost" (list $root $i)) (int $root.Values.ports.peer)) -}}
{{- end -}}
{{- join "," $members -}}
{{- end -}}

{{/* A scalar as a TOML value. YAML numbers reach templates as float64. */}}
{{- define "narad.tomlValue" -}}
{{- if kindIs "string" . -}}
{{- . | quote -}}
{{- else if kindIs "bool" . -}}
{{- . -}}
{{- else if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}
{{- int64 . -}}
{{- else -}}
{{- fail (printf "narad config: %v is not a string, an integer or a boolean" .) -}}
{{- end -}}
{{- end -}}

{{/*
A map as TOML: its scalars first, then each nested map as a [table].
Called with (dict "prefix" "" "table" .Values.config).
*/}}
{{- define "narad.tomlTable" -}}
{{- $prefix := .prefix -}}
{{- range $key, $value := .table }}
{{- if not (kindIs "map" $value) }}
{{ $key }} = {{ include "narad.tomlValue" $value }}
{{- end }}
{{- end }}
{{- range $key, $value := .table }}
{{- if kindIs "map" $value }}
{{- $name := $key }}
{{- if $prefix }}{{ $name = printf "%s.%s" $prefix $key }}{{ end }}

[{{ $name }}]
{{- include "narad.tomlTable" (dict "prefix" $name "table" $value) }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The config table with what the chart adds to it: remote children's CA
file when remoteChildren.caSecret names a Secret. */}}
{{- define "narad.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- if .Values.remoteChildren.caSecret -}}
{{- $children := get $config "children" | default dict -}}
{{- $_ := set $children "remote_ca_file" "/etc/narad/remote-ca/ca.crt" -}}
{{- $_ := set $config "children" $children -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Refuses config keys the chart sets itself. */}}
{{- define "narad.checkConfig" -}}
{{- $config := .Values.config | default dict -}}
{{- range $key := list "data_dir" "listen" "node_id" "peer_listen" "peers" "join" "auth" -}}
{{- if hasKey $config $key -}}
{{- fail (printf "config.%s is set by the chart; remove it from values" $key) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $config "cluster" -}}
{{- if or (hasKey $config.cluster "secret") (hasKey $config.cluster "tls") -}}
{{- fail "config.cluster.secret and config.cluster.tls are set by the chart (peerTrust); remove them from values" -}}
{{- end -}}
{{- end -}}
{{- if hasKey $config "children" -}}
{{- if hasKey $config.children "remote_ca_file" -}}
{{- fail "config.children.remote_ca_file is set by the chart (remoteChildren.caSecret); remove it from values" -}}
{{- end -}}
{{- end -}}
{{- if hasKey $config "http" -}}
{{- if hasKey $config.http "tls" -}}
{{- fail "config.http.tls is set by the chart (tls); remove it from values" -}}
{{- end -}}
{{- end -}}
{{- if not (has .Values.peerTrust.mode (list "secret" "tls")) -}}
{{- fail "peerTrust.mode must be secret or tls" -}}
{{- end -}}
{{- if lt (int .Values.initialMembers) 1 -}}
{{- fail "initialMembers must be at least 1" -}}
{{- end -}}
{{- if lt (int .Values.replicaCount) (int .Values.initialMembers) -}}
{{- fail "replicaCount must not be below initialMembers (decommission and remove nodes first, then lower both)" -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) -}}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" -}}
{{- end -}}
{{- end -}}
