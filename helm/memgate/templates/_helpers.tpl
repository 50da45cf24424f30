{{/*
Names and labels, after `helm create` and bitnami's common chart.
*/}}

{{/* The chart's name, overridable with nameOverride. */}}
{{- define "memgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The fully qualified app name: release-chart, cut at 63 characters (DNS names). A release
whose name already contains the chart's name is used as it is.
*/}}
{{- define "memgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* chart-version, for the helm.sh/chart label. */}}
{{- define "memgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "memgate.labels" -}}
helm.sh/chart: {{ include "memgate.chart" . }}
{{ include "memgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: memgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The labels a selector matches (never change them: selectors are immutable). */}}
{{- define "memgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "memgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component (api, migrations, job, test). */}}
{{- define "memgate.componentSelectorLabels" -}}
{{ include "memgate.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The ServiceAccount's name. */}}
{{- define "memgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "memgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference; a digest, when given, pins it (tag kept for readers). */}}
{{- define "memgate.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry }}{{ $repo = printf "%s/%s" .Values.image.registry $repo }}{{ end -}}
{{- if .Values.image.digest -}}
{{ printf "%s:%s@%s" $repo $tag .Values.image.digest }}
{{- else -}}
{{ printf "%s:%s" $repo $tag }}
{{- end -}}
{{- end }}

{{/* The Secret holding the database URLs and keys: an existing one, or the chart's. */}}
{{- define "memgate.secretName" -}}
{{- default (printf "%s-secrets" (include "memgate.fullname" .)) .Values.secrets.existingSecret }}
{{- end }}

{{/* The CloudNativePG Cluster's name. */}}
{{- define "memgate.cnpgName" -}}
{{- printf "%s-pg" (include "memgate.fullname" .) | trunc 50 | trimSuffix "-" }}
{{- end }}

{{/* The migration hook's copy of the chart-made Secret (the existing one when given). */}}
{{- define "memgate.hookSecretName" -}}
{{- if .Values.secrets.existingSecret }}
{{- .Values.secrets.existingSecret }}
{{- else }}
{{- printf "%s-secrets-hook" (include "memgate.fullname" .) }}
{{- end }}
{{- end }}

{{/* The entries of the chart-made Secret (development only). */}}
{{- define "memgate.secretData" -}}
{{- with .Values.secrets }}
{{- if .databaseUrl }}
{{ .keys.databaseUrl }}: {{ .databaseUrl | quote }}
{{- end }}
{{- if or .migrationDatabaseUrl .databaseUrl }}
# Without an owner's URL the migrations use the app's (a development cluster's single login).
{{ .keys.migrationDatabaseUrl }}: {{ default .databaseUrl .migrationDatabaseUrl | quote }}
{{- end }}
{{ .keys.keyEncryptionKey }}: {{ .keyEncryptionKey | quote }}
{{ .keys.bootstrapAdminClientId }}: {{ .bootstrapAdminClientId | quote }}
{{ .keys.bootstrapAdminSecret }}: {{ .bootstrapAdminSecret | quote }}
{{- if $.Values.postgresql.readReplicaUrl }}
{{ .keys.readDatabaseUrl }}: {{ $.Values.postgresql.readReplicaUrl | quote }}
{{- end }}
{{- if .embeddingApiKey }}
{{ .keys.embeddingApiKey }}: {{ .embeddingApiKey | quote }}
{{- end }}
{{- if .summarizerApiKey }}
{{ .keys.summarizerApiKey }}: {{ .summarizerApiKey | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The basic-auth Secret of the app's login in the CloudNativePG Cluster. */}}
{{- define "memgate.cnpgAppLoginSecret" -}}
{{- .Values.postgresql.cloudnativepg.appLogin.existingSecret }}
{{- end }}

{{/* The public URL: config.publicUrl, else https:// the first Ingress host. */}}
{{- define "memgate.publicUrl" -}}
{{- if .Values.config.publicUrl -}}
{{ .Values.config.publicUrl | trimSuffix "/" }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts -}}
{{ printf "https://%s" (first .Values.ingress.hosts).host }}
{{- else -}}
{{ printf "http://%s.%s.svc:%d" (include "memgate.fullname" .) .Release.Namespace (int .Values.service.port) }}
{{- end -}}
{{- end }}

{{/*
Refuse to render without a key-encryption key: each pod would otherwise make its own key
file and could not open the signing keys the others sealed.
*/}}
{{- define "memgate.validate" -}}
{{- if not .Values.secrets.existingSecret }}
{{- if not .Values.secrets.keyEncryptionKey }}
{{- fail "memgate: a key-encryption key is required: set secrets.existingSecret (with the key named by secrets.keys.keyEncryptionKey) or secrets.keyEncryptionKey (base64url of 32 random bytes: `python -c \"import base64,os;print(base64.urlsafe_b64encode(os.urandom(32)).decode())\"`)" }}
{{- end }}
{{- if and (not .Values.postgresql.cloudnativepg.enabled) (not .Values.secrets.databaseUrl) }}
{{- fail "memgate: secrets.databaseUrl (the app's login, a member of memgate_app) is required without secrets.existingSecret or postgresql.cloudnativepg.enabled" }}
{{- end }}
{{- if not (and .Values.secrets.bootstrapAdminClientId .Values.secrets.bootstrapAdminSecret) }}
{{- fail "memgate: the platform admin's credentials are required: set secrets.existingSecret (with the entries named by secrets.keys.bootstrapAdminClientId and bootstrapAdminSecret) or secrets.bootstrapAdminClientId (a UUID: `uuidgen`) and secrets.bootstrapAdminSecret (32+ characters: `openssl rand -base64 33`). The migration Job's data dir dies with it: the admin's secret must be one you already hold" }}
{{- end }}
{{- end }}
{{- if and .Values.postgresql.cloudnativepg.enabled .Values.migrations.enabled .Values.migrations.asHook }}
{{- fail "memgate: postgresql.cloudnativepg.enabled needs migrations.asHook=false: a pre-install hook runs before the Cluster (and its Secrets) exist; the plain Job waits for them" }}
{{- end }}
{{- if and .Values.postgresql.cloudnativepg.enabled (not .Values.postgresql.cloudnativepg.appLogin.existingSecret) }}
{{- fail "memgate: postgresql.cloudnativepg.appLogin.existingSecret is required: a password the chart made would change on every offline render (Argo CD, helm template), and CloudNativePG would reset the login's password under the running pods. Make a basic-auth Secret labelled cnpg.io/reload=true with username memgate_api and a random alphanumeric password (docs/operations.md, CloudNativePG)" }}
{{- end }}
{{- if and .Values.secrets.existingSecret (not .Values.secrets.keys.keyEncryptionKey) }}
{{- fail "memgate: secrets.keys.keyEncryptionKey must name the key-encryption key's entry in secrets.existingSecret" }}
{{- end }}
{{- end }}

{{/*
The environment every memgate container shares: the database URLs (never inline: from
Secrets), the key-encryption key and the API keys of the optional model endpoints. Call with
(dict "root" . "owner" true) to add the owner's URL (migrations, key rotation), with
"bootstrap" true the platform admin's credentials (the migration Job, which makes it), and
"secret" NAME to read another Secret (the migration hook's copy).
*/}}
{{- define "memgate.secretEnv" -}}
{{- $root := .root -}}
{{- $secret := default (include "memgate.secretName" $root) .secret -}}
{{- $keys := $root.Values.secrets.keys -}}
{{- $cnpg := $root.Values.postgresql.cloudnativepg -}}
{{- if $cnpg.enabled }}
- name: MEMGATE_DB_LOGIN_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "memgate.cnpgAppLoginSecret" $root }}
      key: password
# Composed from the login's Secret by Kubernetes ($(VAR) expansion): the password is never here.
- name: DATABASE_URL
  value: {{ printf "postgresql://%s:$(MEMGATE_DB_LOGIN_PASSWORD)@%s-rw:5432/%s?sslmode=verify-full&sslrootcert=/etc/memgate/postgres-ca/ca.crt" $cnpg.appLogin.name (include "memgate.cnpgName" $root) $cnpg.database | quote }}
# libpq's defaults for URLs that name no sslmode: the owner's (CloudNativePG's `uri`) too.
- name: PGSSLMODE
  value: verify-full
- name: PGSSLROOTCERT
  value: /etc/memgate/postgres-ca/ca.crt
{{- else }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.databaseUrl }}
{{- end }}
{{- include "memgate.readReplicaEnv" $root }}
{{- if .owner }}
- name: MEMGATE_MIGRATION_DATABASE_URL
  valueFrom:
    secretKeyRef:
{{- if $cnpg.enabled }}
      # CloudNativePG's own Secret for the database owner (bootstrap.initdb.owner).
      name: {{ include "memgate.cnpgName" $root }}-app
      key: uri
{{- else }}
      name: {{ $secret }}
      key: {{ $keys.migrationDatabaseUrl }}
{{- end }}
{{- end }}
- name: MEMGATE_KEY_ENCRYPTION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.keyEncryptionKey }}
{{- if .bootstrap }}
- name: MEMGATE_BOOTSTRAP_ADMIN_CLIENT_ID
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.bootstrapAdminClientId }}
- name: MEMGATE_BOOTSTRAP_ADMIN_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.bootstrapAdminSecret }}
{{- end }}
{{- if or $root.Values.secrets.existingSecret $root.Values.secrets.embeddingApiKey }}
- name: MEMGATE_EMBEDDING_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.embeddingApiKey }}
      optional: true
{{- end }}
{{- if or $root.Values.secrets.existingSecret $root.Values.secrets.summarizerApiKey }}
- name: MEMGATE_SUMMARIZER_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $keys.summarizerApiKey }}
      optional: true
{{- end }}
{{- end }}

{{/*
MEMGATE_READ_DATABASE_URL, when read replicas are on: CloudNativePG's `<cluster>-ro` Service
with the app's login (composed as DATABASE_URL is), or a Secret's entry; never inline.
*/}}
{{- define "memgate.readReplicaEnv" -}}
{{- $pg := .Values.postgresql -}}
{{- $cnpg := $pg.cloudnativepg -}}
{{- if and $cnpg.enabled $cnpg.readReplicas }}
- name: MEMGATE_READ_DATABASE_URL
  value: {{ printf "postgresql://%s:$(MEMGATE_DB_LOGIN_PASSWORD)@%s-ro:5432/%s?sslmode=require" $cnpg.appLogin.name (include "memgate.cnpgName" .) $cnpg.database | quote }}
{{- else if or (and (not .Values.secrets.existingSecret) $pg.readReplicaUrl) (and .Values.secrets.existingSecret $pg.readReplicaFromExistingSecret) }}
- name: MEMGATE_READ_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "memgate.secretName" . }}
      key: {{ .Values.secrets.keys.readDatabaseUrl }}
{{- end }}
{{- end }}

{{/* The restricted container securityContext (Pod Security Standards "restricted"). */}}
{{- define "memgate.containerSecurityContext" -}}
{{ toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* The writable places of a read-only root filesystem. */}}
{{- define "memgate.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: data
  mountPath: /data
{{- if .Values.postgresql.cloudnativepg.enabled }}
# The Cluster's CA (its certificate only): libpq checks the server against it (verify-full).
- name: postgres-ca
  mountPath: /etc/memgate/postgres-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "memgate.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.volumes.tmpSizeLimit }}
- name: data
  emptyDir:
    sizeLimit: {{ .Values.volumes.dataSizeLimit }}
{{- if .Values.postgresql.cloudnativepg.enabled }}
- name: postgres-ca
  secret:
    secretName: {{ include "memgate.cnpgName" . }}-ca
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/* Pod-level scheduling and identity shared by every memgate pod. */}}
{{- define "memgate.podCommon" -}}
serviceAccountName: {{ include "memgate.serviceAccountName" . }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Config and secret checksums: a change of either rolls the pods. */}}
{{- define "memgate.checksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}

{{/*
checkov suppressions, each with its reason (tests/contract/helm lists the same set):
- CKV_K8S_35 (secrets as files): memgate reads its settings, secrets included, from the
  environment only (service/settings.py); they come from secretKeyRef, never inline values.
- CKV_K8S_43 (image by digest): only while image.digest is unset; production pins it.
*/}}
{{- define "memgate.checkovSkips" -}}
checkov.io/skip1: CKV_K8S_35=memgate reads secrets from env vars only; they come from secretKeyRef, never inline
{{- if not .Values.image.digest }}
checkov.io/skip2: CKV_K8S_43=image.digest is unset; production values pin the image by digest
{{- end }}
{{- end }}
