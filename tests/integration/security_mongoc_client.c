/* A libmongoc client for test_security.py: runs {count: "c"} on database argv[2] through
 * URI argv[1] (with credentials) and prints "ok N" or "error CODE MESSAGE". */
#include <mongoc/mongoc.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	mongoc_client_t *c;
	bson_t *cmd, reply;
	bson_error_t e;
	bson_iter_t it;
	bool ok;

	if (argc != 3)
		return 2;
	mongoc_init();
	c = mongoc_client_new(argv[1]);
	if (!c)
		return 2;
	mongoc_client_set_error_api(c, MONGOC_ERROR_API_VERSION_2);
	cmd = BCON_NEW("count", BCON_UTF8("c"));
	ok = mongoc_client_command_simple(c, argv[2], cmd, NULL, &reply, &e);
	if (ok && bson_iter_init_find(&it, &reply, "n"))
		printf("ok %lld\n", (long long)bson_iter_as_int64(&it));
	else
		printf("error %u %s\n", e.code, e.message);
	bson_destroy(&reply);
	bson_destroy(cmd);
	mongoc_client_destroy(c);
	mongoc_cleanup();
	return ok ? 0 : 1;
}
