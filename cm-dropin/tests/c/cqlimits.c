/*
 * ibv_create_cq's bounds, as rxe's rxe_cq_chk_attr holds them: a CQ of no entries (0 or a
 * negative count) or of more than the device's max_cqe is EINVAL; max_cqe itself is made.
 * libfabric's ofi_rxm asks for more than rxe's max_cqe by default and fails fi_enable there.
 * Run under cmsim-run on any host: cqlimits
 *
 * Prints "ok" and exits 0 when every check passed; a message on stderr otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <infiniband/verbs.h>

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
	return !ok;
}

/* Whether ibv_create_cq of cqe entries is refused with EINVAL. */
static int refused(struct ibv_context *ctx, int cqe)
{
	struct ibv_cq *cq;

	errno = 0;
	cq = ibv_create_cq(ctx, cqe, NULL, NULL, 0);
	if (cq) {
		ibv_destroy_cq(cq);
		return 0;
	}
	return errno == EINVAL;
}

int main(void)
{
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct ibv_device_attr attr;
	struct ibv_cq *cq;
	int n, bad = 0;

	devs = ibv_get_device_list(&n);
	if (check(devs && n > 0, "a device"))
		return 1;
	ctx = ibv_open_device(devs[0]);
	if (check(ctx != NULL, "ibv_open_device"))
		return 1;
	if (check(ibv_query_device(ctx, &attr) == 0, "ibv_query_device"))
		return 1;
	bad |= check(attr.max_cqe == 32767, "max_cqe is rxe's 32767");
	bad |= check(refused(ctx, 0), "a CQ of 0 entries is EINVAL");
	bad |= check(refused(ctx, -1), "a CQ of -1 entries is EINVAL");
	bad |= check(refused(ctx, attr.max_cqe + 1), "a CQ of max_cqe + 1 entries is EINVAL");
	cq = ibv_create_cq(ctx, attr.max_cqe, NULL, NULL, 0);
	bad |= check(cq != NULL, "a CQ of max_cqe entries is made");
	if (cq)
		bad |= check(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
	bad |= check(cq != NULL, "a CQ of 1 entry is made");
	if (cq)
		bad |= check(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	if (!bad)
		printf("ok\n");
	return bad;
}
