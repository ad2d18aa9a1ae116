/* Configuration: flags > STRIPEDB_* environment > config file (inih). See config.h. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

#define DEFAULT_CONFIG_PATH "/etc/stripedb/stripedb.conf"

typedef struct opt_def {
	const char *name;
	sdb_opt_kind kind;
	const char *def;
	const char *help;
} opt_def;

static const opt_def opt_defs[SDB_OPT__COUNT] = {
#define SDB__OPT_DEF(name, id, kind, def, help) {name, kind, def, help},
	SDB_OPTIONS(SDB__OPT_DEF)
#undef SDB__OPT_DEF
};

const char *const sdb_role_names[] = {"metadata", "proxy", "coordinator", "ratelimit", "shard", NULL};

static int role_known(const char *r)
{
	for (int i = 0; sdb_role_names[i] != NULL; i++) {
		if (strcmp(sdb_role_names[i], r) == 0) {
			return 1;
		}
	}
	return 0;
}

static int opt_lookup(const char *name, size_t len)
{
	for (int i = 0; i < SDB_OPT__COUNT; i++) {
		if (strlen(opt_defs[i].name) == len && strncmp(opt_defs[i].name, name, len) == 0) {
			return i;
		}
	}
	return -1;
}

int sdb_addr_split(const char *addr, char *host, size_t hostlen, int *port, char *err, size_t errlen)
{
	const char *colon;
	const char *h = addr;
	size_t hlen;
	char *end;
	long p;

	if (addr == NULL || *addr == '\0') {
		return sdb_errf(err, errlen, SDB_EINVAL, "empty address, expected HOST:PORT");
	}
	if (*addr == '[') {
		const char *close = strchr(addr, ']');
		if (close == NULL || close[1] != ':') {
			return sdb_errf(err, errlen, SDB_EINVAL, "bad address '%s', expected [V6]:PORT", addr);
		}
		h = addr + 1;
		hlen = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(addr, ':');
		if (colon == NULL || colon == addr) {
			return sdb_errf(err, errlen, SDB_EINVAL, "bad address '%s', expected HOST:PORT", addr);
		}
		hlen = (size_t)(colon - addr);
		if (memchr(addr, ':', hlen) != NULL) {
			return sdb_errf(err, errlen, SDB_EINVAL,
					"bad address '%s', write IPv6 hosts as [V6]:PORT", addr);
		}
	}
	for (size_t i = 0; i < hlen; i++) {
		unsigned char c = (unsigned char)h[i];
		if (!(isalnum(c) || c == '.' || c == '-' || c == '_' || c == ':' || c == '%')) {
			return sdb_errf(err, errlen, SDB_EINVAL, "bad address '%s': bad host", addr);
		}
	}
	if (hlen == 0 || hlen >= hostlen) {
		return sdb_errf(err, errlen, SDB_EINVAL, "bad address '%s': bad host", addr);
	}
	errno = 0;
	p = strtol(colon + 1, &end, 10);
	if (colon[1] == '\0' || *end != '\0' || errno != 0 || p < 0 || p > 65535) {
		return sdb_errf(err, errlen, SDB_EINVAL, "bad address '%s': port must be 0-65535", addr);
	}
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	*port = (int)p;
	return 0;
}

static int validate(int opt, const char *value, char *err, size_t errlen)
{
	char host[256];
	int port;
	sdb_log_level lvl;

	switch (opt_defs[opt].kind) {
	case SDB_OPT_STRING:
	case SDB_OPT_PATH:
		if (*value == '\0') {
			return sdb_errf(err, errlen, SDB_EUSAGE, "empty value");
		}
		return 0;
	case SDB_OPT_ADDR:
		return sdb_addr_split(value, host, sizeof host, &port, err, errlen) == 0 ? 0 : SDB_EUSAGE;
	case SDB_OPT_ADDRS:
	case SDB_OPT_MEMBERS: {
		char *copy = sdb_strdup(value);
		char *save = NULL;
		int rc = 0;
		int n = 0;
		for (char *tok = strtok_r(copy, ",", &save); tok != NULL && rc == 0;
		     tok = strtok_r(NULL, ",", &save)) {
			char *a = tok;
			n++;
			if (opt_defs[opt].kind == SDB_OPT_MEMBERS) {
				char *at = strchr(tok, '@');
				char *end;
				long id;
				if (at == NULL) {
					rc = sdb_errf(err, errlen, SDB_EUSAGE,
						      "bad member '%s', expected ID@HOST:PORT", tok);
					break;
				}
				*at = '\0';
				id = strtol(tok, &end, 10);
				if (*tok == '\0' || *end != '\0' || id <= 0) {
					rc = sdb_errf(err, errlen, SDB_EUSAGE,
						      "bad member id '%s', expected a positive integer", tok);
					break;
				}
				a = at + 1;
			}
			if (sdb_addr_split(a, host, sizeof host, &port, err, errlen) != 0) {
				rc = SDB_EUSAGE;
			}
		}
		free(copy);
		if (rc == 0 && n == 0) {
			rc = sdb_errf(err, errlen, SDB_EUSAGE, "empty list");
		}
		return rc;
	}
	case SDB_OPT_INT: {
		char *end;
		long long v;
		errno = 0;
		v = strtoll(value, &end, 10);
		if (*value == '\0' || *end != '\0' || errno != 0 || v < 0) {
			return sdb_errf(err, errlen, SDB_EUSAGE, "'%s' is not a non-negative integer",
					value);
		}
		if (v == 0 && opt == SDB_OPT_max_connections) {
			return sdb_errf(err, errlen, SDB_EUSAGE, "must be at least 1");
		}
		return 0;
	}
	case SDB_OPT_BOOL:
		if (strcmp(value, "true") && strcmp(value, "false") && strcmp(value, "1") &&
		    strcmp(value, "0") && strcmp(value, "yes") && strcmp(value, "no")) {
			return sdb_errf(err, errlen, SDB_EUSAGE, "'%s' is not true or false", value);
		}
		return 0;
	case SDB_OPT_LEVEL:
		if (sdb_log_parse_level(value, &lvl) != 0) {
			return sdb_errf(err, errlen, SDB_EUSAGE,
					"'%s' is not a log level (debug, info, warn, error)", value);
		}
		return 0;
	}
	return 0;
}

/* One source layer: a value per option per scope (scope 0 = global, 1.. = roles by name). */
typedef struct layer {
	char *global[SDB_OPT__COUNT];
	struct {
		char name[32];
		char *values[SDB_OPT__COUNT];
	} roles[16];
	size_t n_roles;
} layer;

static char **layer_scope(layer *l, const char *role)
{
	if (role == NULL) {
		return l->global;
	}
	for (size_t i = 0; i < l->n_roles; i++) {
		if (strcmp(l->roles[i].name, role) == 0) {
			return l->roles[i].values;
		}
	}
	if (l->n_roles == 16) {
		return NULL;
	}
	snprintf(l->roles[l->n_roles].name, sizeof l->roles[0].name, "%s", role);
	return l->roles[l->n_roles++].values;
}

static void layer_free(layer *l)
{
	for (int o = 0; o < SDB_OPT__COUNT; o++) {
		free(l->global[o]);
		for (size_t i = 0; i < l->n_roles; i++) {
			free(l->roles[i].values[o]);
		}
	}
	memset(l, 0, sizeof *l);
}

static void set_value(char **slot, const char *v)
{
	free(*slot);
	*slot = sdb_strdup(v);
}

typedef struct file_ctx {
	layer *l;
	const char *path;
	char *err;
	size_t errlen;
	int rc;
	char roles[256]; /* `role = a,b` key in the file's global section */
	FILE *f;
	int lineno; /* line being parsed (Debian's inih is built without INI_HANDLER_LINENO) */
} file_ctx;

/* inih reader that counts lines for error messages. */
static char *ini_reader_fn(char *str, int num, void *stream)
{
	file_ctx *fc = stream;
	char *r = fgets(str, num, fc->f);

	if (r != NULL) {
		fc->lineno++;
	}
	return r;
}

static int ini_cb(void *user, const char *section, const char *name, const char *value)
{
	file_ctx *fc = user;
	int lineno = fc->lineno;
	const char *role = (section == NULL || *section == '\0' || strcmp(section, "global") == 0)
				   ? NULL
				   : section;
	char verr[256];
	char **scope;
	int opt;

	if (fc->rc != 0) {
		return 0;
	}
	if (role != NULL && !role_known(role)) {
		fc->rc = sdb_errf(fc->err, fc->errlen, SDB_EUSAGE, "%s:%d: unknown role section [%s]",
				  fc->path, lineno, role);
		return 0;
	}
	if (strcmp(name, "role") == 0 && role == NULL) {
		snprintf(fc->roles, sizeof fc->roles, "%s", value);
		return 1;
	}
	opt = opt_lookup(name, strlen(name));
	if (opt < 0 || opt == SDB_OPT_config) {
		fc->rc = sdb_errf(fc->err, fc->errlen, SDB_EUSAGE, "%s:%d: unknown key '%s'", fc->path,
				  lineno, name);
		return 0;
	}
	if (validate(opt, value, verr, sizeof verr) != 0) {
		fc->rc = sdb_errf(fc->err, fc->errlen, SDB_EUSAGE, "%s:%d: %s: %s", fc->path, lineno,
				  name, verr);
		return 0;
	}
	scope = layer_scope(fc->l, role);
	if (scope == NULL) {
		fc->rc = sdb_errf(fc->err, fc->errlen, SDB_EUSAGE, "%s:%d: too many sections", fc->path,
				  lineno);
		return 0;
	}
	set_value(&scope[opt], value);
	return 1;
}

static int load_file(const char *path, int explicit_path, layer *l, char *roles, size_t roleslen,
		     char *err, size_t errlen)
{
	file_ctx fc = {.l = l, .path = path, .err = err, .errlen = errlen};
	FILE *f = fopen(path, "r");
	int rc;

	if (f == NULL) {
		if (!explicit_path && errno == ENOENT) {
			return 0;
		}
		return sdb_errf(err, errlen, SDB_EIO, "cannot read config file %s: %s", path,
				strerror(errno));
	}
	{
		struct stat st;
		if (fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) {
			fclose(f);
			return sdb_errf(err, errlen, SDB_EIO, "cannot read config file %s: %s", path,
					strerror(EISDIR));
		}
	}
	fc.f = f;
	rc = ini_parse_stream(ini_reader_fn, &fc, ini_cb, &fc);
	fclose(f);
	if (fc.rc != 0) {
		return fc.rc;
	}
	if (rc != 0) {
		return sdb_errf(err, errlen, SDB_EUSAGE, "%s:%d: syntax error", path, rc);
	}
	snprintf(roles, roleslen, "%s", fc.roles);
	return 0;
}

static int load_env(char **envp, layer *l, char *roles, size_t roleslen, char *err, size_t errlen)
{
	for (char **e = envp; e != NULL && *e != NULL; e++) {
		const char *kv = *e;
		const char *eq;
		char name[64];
		size_t n;
		int opt;
		char verr[256];

		if (strncmp(kv, "STRIPEDB_", 9) != 0 || (eq = strchr(kv, '=')) == NULL) {
			continue;
		}
		n = (size_t)(eq - (kv + 9));
		if (n == 0 || n >= sizeof name) {
			continue;
		}
		for (size_t i = 0; i < n; i++) {
			char c = kv[9 + i];
			name[i] = c == '_' ? '-' : (char)tolower((unsigned char)c);
		}
		name[n] = '\0';
		if (strcmp(name, "role") == 0) {
			snprintf(roles, roleslen, "%s", eq + 1);
			continue;
		}
		opt = opt_lookup(name, n);
		if (opt < 0) {
			continue; /* other STRIPEDB_* variables (e.g. test knobs) are not options */
		}
		if (validate(opt, eq + 1, verr, sizeof verr) != 0) {
			return sdb_errf(err, errlen, SDB_EUSAGE, "%.*s: %s", (int)(eq - kv), kv, verr);
		}
		set_value(&l->global[opt], eq + 1);
	}
	return 0;
}

static int add_roles_from_list(const char *list, char names[][32], size_t *n, char *err, size_t errlen)
{
	char *copy = sdb_strdup(list);
	char *save = NULL;
	int rc = 0;

	for (char *tok = strtok_r(copy, ", ", &save); tok != NULL; tok = strtok_r(NULL, ", ", &save)) {
		if (!role_known(tok)) {
			rc = sdb_errf(err, errlen, SDB_EUSAGE,
				      "unknown role '%s' (roles: metadata, proxy, coordinator, ratelimit, shard)",
				      tok);
			break;
		}
		if (*n == 16) {
			rc = sdb_errf(err, errlen, SDB_EUSAGE, "too many roles");
			break;
		}
		snprintf(names[(*n)++], 32, "%s", tok);
	}
	free(copy);
	return rc;
}

int sdb_config_parse(int argc, char **argv, char **envp, sdb_config_set *out, char *err, size_t errlen)
{
	layer flags = {0}, env = {0}, file = {0};
	char role_names[16][32];
	size_t n_roles = 0;
	const char *cur_role = NULL;
	char env_roles[256] = "", file_roles[256] = "";
	const char *config_path = NULL;
	int explicit_config = 0;
	int rc = 0;

	memset(out, 0, sizeof *out);
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		const char *name, *value = NULL, *eq;
		size_t nlen;
		int opt;
		char verr[256];
		char **scope;

		if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
			rc = sdb_errf(err, errlen, SDB_EUSAGE, "unexpected argument '%s'", a);
			goto err;
		}
		name = a + 2;
		eq = strchr(name, '=');
		nlen = eq != NULL ? (size_t)(eq - name) : strlen(name);
		if (eq != NULL) {
			value = eq + 1;
		}
		if (nlen == 4 && strncmp(name, "role", 4) == 0) {
			if (value == NULL) {
				if (i + 1 >= argc) {
					rc = sdb_errf(err, errlen, SDB_EUSAGE, "--role needs a value");
					goto err;
				}
				value = argv[++i];
			}
			rc = add_roles_from_list(value, role_names, &n_roles, err, errlen);
			if (rc != 0) {
				goto err;
			}
			cur_role = role_names[n_roles - 1];
			continue;
		}
		opt = opt_lookup(name, nlen);
		if (opt < 0) {
			rc = sdb_errf(err, errlen, SDB_EUSAGE, "unknown flag --%.*s (see stripedb --help)",
				      (int)nlen, name);
			goto err;
		}
		if (value == NULL) {
			if (opt_defs[opt].kind == SDB_OPT_BOOL) {
				value = "true";
			} else if (i + 1 < argc) {
				value = argv[++i];
			} else {
				rc = sdb_errf(err, errlen, SDB_EUSAGE, "--%s needs a value", opt_defs[opt].name);
				goto err;
			}
		}
		if (validate(opt, value, verr, sizeof verr) != 0) {
			rc = sdb_errf(err, errlen, SDB_EUSAGE, "--%s: %s", opt_defs[opt].name, verr);
			goto err;
		}
		if (opt == SDB_OPT_config) {
			config_path = value;
			explicit_config = 1;
		}
		scope = layer_scope(&flags, cur_role);
		set_value(&scope[opt], value);
	}

	rc = load_env(envp, &env, env_roles, sizeof env_roles, err, errlen);
	if (rc != 0) {
		goto err;
	}
	if (config_path == NULL && env.global[SDB_OPT_config] != NULL) {
		config_path = env.global[SDB_OPT_config];
		explicit_config = 1;
	}
	if (config_path == NULL) {
		config_path = DEFAULT_CONFIG_PATH;
	}
	rc = load_file(config_path, explicit_config, &file, file_roles, sizeof file_roles, err, errlen);
	if (rc != 0) {
		goto err;
	}

	if (n_roles == 0 && env_roles[0] != '\0') {
		rc = add_roles_from_list(env_roles, role_names, &n_roles, err, errlen);
	}
	if (rc == 0 && n_roles == 0 && file_roles[0] != '\0') {
		rc = add_roles_from_list(file_roles, role_names, &n_roles, err, errlen);
	}
	if (rc != 0) {
		goto err;
	}
	if (n_roles == 0) {
		rc = sdb_errf(err, errlen, SDB_EUSAGE,
			      "no role given: use --role=metadata|proxy|coordinator|ratelimit|shard");
		goto err;
	}
	for (size_t i = 0; i < n_roles; i++) {
		for (size_t j = 0; j < i; j++) {
			if (strcmp(role_names[i], role_names[j]) == 0) {
				rc = sdb_errf(err, errlen, SDB_EUSAGE, "role %s given twice", role_names[i]);
				goto err;
			}
		}
	}

	out->n_roles = n_roles;
	out->roles = sdb_calloc(n_roles, sizeof *out->roles);
	for (int o = 0; o < SDB_OPT__COUNT; o++) {
		const char *v = flags.global[o] != NULL ? flags.global[o]
				: env.global[o] != NULL ? env.global[o]
				: file.global[o] != NULL ? file.global[o]
				: opt_defs[o].def;
		out->global.values[o] = v != NULL ? sdb_strdup(v) : NULL;
	}
	for (size_t r = 0; r < n_roles; r++) {
		const char *rn = role_names[r];
		char **fr = NULL, **filer = NULL;
		for (size_t i = 0; i < flags.n_roles; i++) {
			if (strcmp(flags.roles[i].name, rn) == 0) {
				fr = flags.roles[i].values;
			}
		}
		for (size_t i = 0; i < file.n_roles; i++) {
			if (strcmp(file.roles[i].name, rn) == 0) {
				filer = file.roles[i].values;
			}
		}
		out->roles[r].role = sdb_strdup(rn);
		for (int o = 0; o < SDB_OPT__COUNT; o++) {
			const char *v = fr != NULL && fr[o] != NULL ? fr[o]
					: flags.global[o] != NULL  ? flags.global[o]
					: env.global[o] != NULL	   ? env.global[o]
					: filer != NULL && filer[o] != NULL ? filer[o]
					: file.global[o] != NULL ? file.global[o]
								 : opt_defs[o].def;
			out->roles[r].values[o] = v != NULL ? sdb_strdup(v) : NULL;
		}
	}
	layer_free(&flags);
	layer_free(&env);
	layer_free(&file);
	return 0;

err:
	layer_free(&flags);
	layer_free(&env);
	layer_free(&file);
	sdb_config_set_free(out);
	return rc;
}

static void config_free(sdb_config *c)
{
	free(c->role);
	for (int o = 0; o < SDB_OPT__COUNT; o++) {
		free(c->values[o]);
	}
	memset(c, 0, sizeof *c);
}

void sdb_config_set_free(sdb_config_set *set)
{
	for (size_t i = 0; i < set->n_roles; i++) {
		config_free(&set->roles[i]);
	}
	free(set->roles);
	config_free(&set->global);
	memset(set, 0, sizeof *set);
}

const char *sdb_config_get(const sdb_config *cfg, sdb_opt opt)
{
	return cfg->values[opt];
}

int64_t sdb_config_get_int(const sdb_config *cfg, sdb_opt opt, int64_t def)
{
	const char *v = cfg->values[opt];

	return v != NULL ? strtoll(v, NULL, 10) : def;
}

int sdb_config_get_bool(const sdb_config *cfg, sdb_opt opt, int def)
{
	const char *v = cfg->values[opt];

	if (v == NULL) {
		return def;
	}
	return strcmp(v, "true") == 0 || strcmp(v, "1") == 0 || strcmp(v, "yes") == 0;
}

void sdb_config_print_help(void *stream)
{
	FILE *f = stream;

	for (int o = 0; o < SDB_OPT__COUNT; o++) {
		char flag[64];
		snprintf(flag, sizeof flag, "--%s=%s", opt_defs[o].name,
			 opt_defs[o].kind == SDB_OPT_ADDR	? "H:P"
			 : opt_defs[o].kind == SDB_OPT_ADDRS	? "H:P,..."
			 : opt_defs[o].kind == SDB_OPT_MEMBERS ? "ID@H:P,..."
			 : opt_defs[o].kind == SDB_OPT_INT	? "N"
			 : opt_defs[o].kind == SDB_OPT_PATH	? "PATH"
			 : opt_defs[o].kind == SDB_OPT_BOOL	? "BOOL"
								: "VALUE");
		fprintf(f, "  %-34s %s", flag, opt_defs[o].help);
		if (opt_defs[o].def != NULL) {
			fprintf(f, " [default %s]", opt_defs[o].def);
		}
		fputc('\n', f);
	}
}
