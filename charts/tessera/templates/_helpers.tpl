{{/*
Names are fixed, not prefixed by the release: the RBAC, the admission policy and the
DeviceClasses (cluster-scoped, one driver per cluster) refer to them, so one Tessera
release per cluster.
*/}}

{{/* Labels every templated object carries; the Helm-only ones are the first three. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: tessera
{{- end }}

{{- define "tessera.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
A file of files/, copied from config/ by `cargo xtask chart`, with the namespace the
manifests in config/ use (tessera-system) replaced by the release's.
*/}}
{{- define "tessera.file" -}}
{{ .root.Files.Get .path | replace "tessera-system" .root.Release.Namespace }}
{{- end }}
