/* A datagram between UD QPs of rdma_create_qp, checking that each side's completion names
 * its own QP (ibv_wc.qp_num is the local QP's number, what qp->qp_num reads).
 *
 *   udqpn server ADDR    accepts one SIDR request, receives one datagram
 *   udqpn client ADDR    resolves ADDR, sends one datagram to the server's QP
 *
 * The client then passes an id it destroyed (EINVAL). Prints "udqpn SIDE: ok" when every
 * check passed. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>

#define GRH 40
#define MSG 32

static char buf[GRH + MSG];

static void die(const char *what)
{
	fprintf(stderr, "udqpn: %s failed: %s\n", what, strerror(errno));
	exit(1);
}

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "udqpn: check failed: %s\n", what);
	return !ok;
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	if (ev->event != type) {
		fprintf(stderr, "udqpn: got %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
			rdma_event_str(type));
		exit(1);
	}
	return ev;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr attr;
	memset(&attr, 0, sizeof attr);
	attr.qp_type = IBV_QPT_UD;
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.sq_sig_all = 1;
	if (rdma_create_qp(id, NULL, &attr))
		die("rdma_create_qp");
}

/* One completion of `cq`, within five seconds. */
static struct ibv_wc poll_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	time_t end = time(NULL) + 5;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0 && time(NULL) < end)
		;
	if (n != 1) {
		fprintf(stderr, "udqpn: no completion (%d)\n", n);
		exit(1);
	}
	return wc;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct rdma_cm_event *ev;
	struct rdma_addrinfo hints, *res;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct ibv_wc wc;
	int server, bad = 0;

	if (argc != 3)
		return 2;
	server = !strcmp(argv[1], "server");
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_UDP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], "7471", &hints, &res))
		die("rdma_getaddrinfo");
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_UDP))
		die("rdma_create_id");
	if (server) {
		struct rdma_conn_param param;
		struct rdma_cm_id *listener = id;
		if (rdma_bind_addr(listener, res->ai_src_addr) || rdma_listen(listener, 1))
			die("rdma_bind_addr/rdma_listen");
		ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		id = ev->id;
		rdma_ack_cm_event(ev);
		make_qp(id);
		mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			die("ibv_reg_mr");
		sge = (struct ibv_sge){ (uintptr_t)buf, sizeof buf, mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad_rwr;
		if ((errno = ibv_post_recv(id->qp, &rwr, &bad_rwr)))
			die("ibv_post_recv");
		memset(&param, 0, sizeof param);
		param.qp_num = id->qp->qp_num;
		if (rdma_accept(id, &param))
			die("rdma_accept");
		wc = poll_one(id->recv_cq);
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV, "the datagram arrives");
		bad |= check(wc.byte_len == GRH + MSG && !strcmp(buf + GRH, "datagram"), "its bytes arrive");
		bad |= check(wc.qp_num == id->qp->qp_num, "the receive's completion names the server's QP");
	} else {
		struct ibv_ah *ah;
		struct rdma_ud_param ud;
		if (rdma_resolve_addr(id, res->ai_src_addr, res->ai_dst_addr, 2000))
			die("rdma_resolve_addr");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
		make_qp(id);
		if (rdma_resolve_route(id, 2000))
			die("rdma_resolve_route");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		if (rdma_connect(id, NULL))
			die("rdma_connect");
		ev = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
		ud = ev->param.ud;
		rdma_ack_cm_event(ev);
		ah = ibv_create_ah(id->pd, &ud.ah_attr);
		mr = ibv_reg_mr(id->pd, buf, sizeof buf, 0);
		if (!ah || !mr)
			die("ibv_create_ah/ibv_reg_mr");
		strcpy(buf, "datagram");
		sge = (struct ibv_sge){ (uintptr_t)buf, MSG, mr->lkey };
		struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					   .send_flags = IBV_SEND_SIGNALED }, *bad_swr;
		swr.wr.ud.ah = ah;
		swr.wr.ud.remote_qpn = ud.qp_num;
		swr.wr.ud.remote_qkey = ud.qkey;
		if ((errno = ibv_post_send(id->qp, &swr, &bad_swr)))
			die("ibv_post_send");
		wc = poll_one(id->send_cq);
		bad |= check(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2, "the send completes");
		bad |= check(wc.qp_num == id->qp->qp_num, "the send's completion names the client's QP");
		/* An id destroyed already is refused, not read after its free (perftest 4.5's
		 * rdma_cm client retries with such ids). */
		struct rdma_cm_id *gone;
		if (rdma_create_id(ch, &gone, NULL, RDMA_PS_UDP) || rdma_destroy_id(gone))
			die("rdma_create_id/rdma_destroy_id");
		errno = 0;
		bad |= check(rdma_destroy_id(gone) == -1 && errno == EINVAL, "a destroyed id is EINVAL");
	}
	printf("udqpn %s: %s\n", argv[1], bad ? "FAILED" : "ok");
	return bad;
}
