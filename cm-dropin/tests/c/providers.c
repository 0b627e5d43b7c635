/*
 * Loads each provider library named on the command line with dlopen(RTLD_NOW), as libibverbs
 * itself or a program linking libmlx5/libefa would: every symbol the provider imports from
 * libibverbs' private node IBVERBS_PRIVATE_34 must be bound at once. Then lists the devices:
 * a provider's registration must not add any.
 *
 * Prints "loaded PATH" or "failed PATH: REASON" per library, then "devices: NAME..." and
 * exits 0 when every library loaded.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <infiniband/verbs.h>

int main(int argc, char **argv)
{
	int failed = 0, i, n = 0;
	struct ibv_device **list;

	for (i = 1; i < argc; i++) {
		void *h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);

		if (h) {
			printf("loaded %s\n", argv[i]);
		} else {
			printf("failed %s: %s\n", argv[i], dlerror());
			failed = 1;
		}
	}
	list = ibv_get_device_list(&n);
	printf("devices:");
	for (i = 0; list && i < n; i++)
		printf(" %s", ibv_get_device_name(list[i]));
	printf("\n");
	if (list)
		ibv_free_device_list(list);
	return failed;
}
