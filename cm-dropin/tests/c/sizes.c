/*
 * Messages of every size up to the port's max_msg_sz: a SEND, an RDMA WRITE and an RDMA READ
 * of exactly max_msg_sz bytes arrive whole, and one byte more is refused at post time with
 * EINVAL (as rxe's post_send does), never a hang or a cut message; a WRITE with a key the
 * peer never gave is REM_ACCESS_ERR, and the QP flushes after it.
 *
 *   sizes server ADDR    registers a region for the client's WRITE and READ, receives
 *   sizes client ADDR    sends, writes, reads, checks, then tries one byte past the limit
 *
 * Exit status 0 when every check passed; a message on stderr otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

static int fail(const char *what)
{
	perror(what);
	return 1;
}

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s\n", what);
	return !ok;
}

static unsigned char pattern(size_t i, int salt)
{
	return (unsigned char)(i * 13 + salt);
}

static int filled(const unsigned char *p, size_t n, int salt)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (p[i] != pattern(i, salt)) {
			fprintf(stderr, "byte %zu of %zu is %u, not %u\n", i, n, p[i], pattern(i, salt));
			return 0;
		}
	return 1;
}

static void fill(unsigned char *p, size_t n, int salt)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = pattern(i, salt);
}

static int wait_send(struct rdma_cm_id *id, struct ibv_wc *wc)
{
	int ret;

	while ((ret = rdma_get_send_comp(id, wc)) == 0)
		;
	return ret < 0;
}

static int wait_recv(struct rdma_cm_id *id, struct ibv_wc *wc)
{
	int ret;

	while ((ret = rdma_get_recv_comp(id, wc)) == 0)
		;
	return ret < 0;
}

/* What the server tells the client: where its region is. */
struct region {
	uint64_t addr;
	uint32_t rkey;
	uint32_t len;
};

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct ibv_qp_init_attr attr;
	struct ibv_port_attr port;
	struct rdma_cm_id *listen_id, *id;
	struct ibv_mr *mr, *ctl_mr;
	struct ibv_wc wc;
	struct region region;
	unsigned char *buf;
	size_t max;
	int server, bad = 0, ret;

	if (argc != 3)
		return 2;
	server = !strcmp(argv[1], "server");
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], "7471", &hints, &res))
		return fail("rdma_getaddrinfo");
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	if (rdma_create_ep(server ? &listen_id : &id, res, NULL, &attr))
		return fail("rdma_create_ep");
	if (server) {
		if (rdma_listen(listen_id, 1))
			return fail("rdma_listen");
		if (rdma_get_request(listen_id, &id))
			return fail("rdma_get_request");
	}
	if (ibv_query_port(id->verbs, id->port_num ? id->port_num : 1, &port))
		return fail("ibv_query_port");
	max = port.max_msg_sz;
	bad |= check(max >= 4096 && max <= (64u << 20), "max_msg_sz is a sensible size");
	/* One byte more than a message may hold, for the refused posts. */
	buf = calloc(1, max + 1);
	if (!buf)
		return fail("calloc");
	mr = ibv_reg_mr(id->pd, buf, max + 1,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	ctl_mr = rdma_reg_msgs(id, &region, sizeof region);
	if (!mr || !ctl_mr)
		return fail("ibv_reg_mr");

	if (server) {
		/* The client's SEND of max bytes lands here, then its WRITE overwrites it. */
		if (rdma_post_recv(id, (void *)1, buf, max, mr))
			return fail("rdma_post_recv");
		if (rdma_accept(id, NULL))
			return fail("rdma_accept");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.byte_len == max,
			     "a SEND of max_msg_sz bytes is received whole");
		bad |= check(filled(buf, max, 1), "the SEND's bytes arrive intact");
		/*
		 * Only now the region: the drop-in places a received message when it is polled,
		 * so a WRITE behind an unpolled SEND would be overwritten by it (README: departures).
		 * The client WRITEs (salt 2), then says so; the server prepares the READ (salt 3).
		 */
		if (rdma_post_recv(id, (void *)3, &region, sizeof region, ctl_mr))
			return fail("rdma_post_recv");
		region.addr = (uintptr_t)buf;
		region.rkey = mr->rkey;
		region.len = max + 1;
		if (rdma_post_send(id, (void *)2, &region, sizeof region, ctl_mr, 0))
			return fail("rdma_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		bad |= check(filled(buf, max, 2), "an RDMA WRITE of max_msg_sz bytes lands whole");
		fill(buf, max, 3);
		if (rdma_post_send(id, (void *)4, &region, sizeof region, ctl_mr, 0))
			return fail("rdma_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		/* The client's last word: it is done reading. */
		if (rdma_post_recv(id, (void *)5, &region, sizeof region, ctl_mr))
			return fail("rdma_post_recv");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		/* Then it tries a key that is not this region's, and disconnects: this receive
		 * completes (flushed) when the connection goes. */
		if (rdma_post_recv(id, (void *)6, &region, sizeof region, ctl_mr))
			return fail("rdma_post_recv");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
	} else {
		if (rdma_post_recv(id, (void *)1, &region, sizeof region, ctl_mr))
			return fail("rdma_post_recv");
		if (rdma_connect(id, NULL))
			return fail("rdma_connect");
		fill(buf, max, 1);
		if (rdma_post_send(id, (void *)2, buf, max, mr, 0))
			return fail("rdma_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.byte_len == max,
			     "a SEND of max_msg_sz bytes completes");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");
		struct region remote = region;

		fill(buf, max, 2);
		if (rdma_post_write(id, (void *)3, buf, max, mr, 0, remote.addr, remote.rkey))
			return fail("rdma_post_write");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS, "an RDMA WRITE of max_msg_sz bytes completes");
		if (rdma_post_recv(id, (void *)4, &region, sizeof region, ctl_mr))
			return fail("rdma_post_recv");
		if (rdma_post_send(id, (void *)5, &region, sizeof region, ctl_mr, 0))
			return fail("rdma_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		if (wait_recv(id, &wc))
			return fail("rdma_get_recv_comp");

		memset(buf, 0, max);
		if (rdma_post_read(id, (void *)6, buf, max, mr, 0, remote.addr, remote.rkey))
			return fail("rdma_post_read");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS, "an RDMA READ of max_msg_sz bytes completes");
		bad |= check(filled(buf, max, 3), "the READ's bytes arrive intact");

		/* One byte more: refused at post time, the QP untouched. */
		errno = 0;
		ret = rdma_post_send(id, (void *)7, buf, max + 1, mr, 0);
		bad |= check(ret != 0 && errno == EINVAL, "a SEND past max_msg_sz is refused with EINVAL");
		errno = 0;
		ret = rdma_post_write(id, (void *)8, buf, max + 1, mr, 0, remote.addr, remote.rkey);
		bad |= check(ret != 0 && errno == EINVAL, "a WRITE past max_msg_sz is refused with EINVAL");
		errno = 0;
		ret = rdma_post_read(id, (void *)9, buf, max + 1, mr, 0, remote.addr, remote.rkey);
		bad |= check(ret != 0 && errno == EINVAL, "a READ past max_msg_sz is refused with EINVAL");

		/* Still connected and working: the server waits for this. */
		if (rdma_post_send(id, (void *)10, &region, sizeof region, ctl_mr, 0))
			return fail("rdma_post_send");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_SUCCESS, "the QP works after the refused posts");

		/* A key the peer never gave: its NIC refuses it, and the QP goes to ERR. */
		if (rdma_post_write(id, (void *)11, buf, 16, mr, 0, remote.addr, remote.rkey ^ 0x40000000u))
			return fail("rdma_post_write");
		if (wait_send(id, &wc))
			return fail("rdma_get_send_comp");
		bad |= check(wc.status == IBV_WC_REM_ACCESS_ERR, "a WRITE with a key not the peer's is REM_ACCESS_ERR");
		if (rdma_post_send(id, (void *)12, &region, sizeof region, ctl_mr, 0) == 0) {
			if (wait_send(id, &wc))
				return fail("rdma_get_send_comp");
			bad |= check(wc.status == IBV_WC_WR_FLUSH_ERR, "after it, the QP flushes");
		}
	}
	rdma_disconnect(id);
	printf("%s: %s\n", argv[1], bad ? "FAILED" : "ok");
	return bad;
}
