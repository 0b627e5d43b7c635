/* Datagrams between UD QPs of ibv_create_qp, in the style of rdma-core's ibv_ud_pingpong: each
 * side moves its QP RESET -> INIT (with its Q_Key) -> RTR -> RTS and makes an address handle
 * for the peer, whose QP number and GID it reads from stdin after printing its own.
 *
 *   vud server|client
 *
 * The client sends "ping" every 50 ms (a datagram may reach the server before its QP is ready,
 * and is then dropped) until the server's "pong" comes, then "bye". Prints "vud: ok". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define QKEY 0x11111111
#define GRH 40
#define MSG 64

static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_ah *ah;
static struct ibv_mr *mr;
static unsigned peer_qpn;
static char out[MSG], in[GRH + MSG];

static void die(const char *what)
{
	printf("vud: %s failed: %s\n", what, strerror(errno));
	exit(1);
}

static void post_recv(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)in, .length = sizeof(in), .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if ((errno = ibv_post_recv(qp, &wr, &bad)))
		die("ibv_post_recv");
}

static void send_text(const char *text)
{
	snprintf(out, MSG, "%s", text);
	struct ibv_sge sge = { .addr = (uintptr_t)out, .length = (uint32_t)strlen(text) + 1, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
		.wr.ud = { .ah = ah, .remote_qpn = peer_qpn, .remote_qkey = QKEY },
	}, *bad;
	if ((errno = ibv_post_send(qp, &wr, &bad)))
		die("ibv_post_send");
}

/* The next receive's text within `ms` (NULL if none came); send completions are taken on the
 * way. */
static const char *receive(int ms)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (;;) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			die("ibv_poll_cq");
		if (n == 1) {
			if (wc.status != IBV_WC_SUCCESS) {
				printf("vud: completion %s\n", ibv_wc_status_str(wc.status));
				exit(1);
			}
			if (wc.opcode == IBV_WC_RECV) {
				if (!(wc.wc_flags & IBV_WC_GRH) || wc.src_qp != peer_qpn || wc.qp_num != qp->qp_num) {
					printf("vud: a datagram from QP %u (flags %u) on QP %u\n", wc.src_qp, wc.wc_flags, wc.qp_num);
					exit(1);
				}
				return in + GRH;
			}
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 > ms)
			return NULL;
		usleep(200);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	int server = !strcmp(argv[1], "server");
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	if (!ctx)
		die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	mr = pd ? ibv_reg_mr(pd, in, sizeof(in), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!pd || !cq || !mr)
		die("pd, cq or mr");
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &init);
	if (!qp)
		die("ibv_create_qp");
	struct ibv_qp_attr attr = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	/* ACCESS_FLAGS is an RC QP's: refused for UD. */
	if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != EINVAL)
		die("refusing ACCESS_FLAGS on a UD QP");
	if ((errno = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)))
		die("ibv_modify_qp INIT");
	post_recv();
	attr.qp_state = IBV_QPS_RTR;
	if ((errno = ibv_modify_qp(qp, &attr, IBV_QP_STATE)))
		die("ibv_modify_qp RTR");
	attr.qp_state = IBV_QPS_RTS;
	attr.sq_psn = 1;
	if ((errno = ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN)))
		die("ibv_modify_qp RTS");
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 1, &gid))
		die("ibv_query_gid");
	printf("QP %06x GID ", qp->qp_num);
	for (int i = 0; i < 16; i++)
		printf("%02x", gid.raw[i]);
	printf("\n");
	fflush(stdout);
	char text[33];
	if (scanf("QP %x GID %32s", &peer_qpn, text) != 2)
		die("reading the peer's QP and GID");
	struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1, .grh = { .sgid_index = 1, .hop_limit = 1 } };
	for (int i = 0; i < 16; i++) {
		unsigned v;
		sscanf(text + 2 * i, "%2x", &v);
		ah_attr.grh.dgid.raw[i] = (uint8_t)v;
	}
	ah = ibv_create_ah(pd, &ah_attr);
	if (!ah)
		die("ibv_create_ah");
	if (server) {
		int pongs = 0;
		for (;;) {
			const char *got = receive(20000);
			if (!got)
				die("waiting for the client");
			post_recv();
			if (!strcmp(got, "bye"))
				break;
			if (strcmp(got, "ping"))
				die("an unexpected datagram");
			send_text("pong");
			pongs++;
		}
		if (pongs < 1)
			die("no ping");
	} else {
		const char *got = NULL;
		for (int tries = 0; !got && tries < 400; tries++) {
			send_text("ping");
			got = receive(50);
		}
		if (!got || strcmp(got, "pong"))
			die("the server's pong");
		send_text("bye");
		receive(200);
	}
	if (ibv_destroy_ah(ah) || ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd))
		die("tearing down");
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("vud: ok\n");
	return 0;
}
