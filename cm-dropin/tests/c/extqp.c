/* An rdma_cm client and server whose QPs are their own, as rdma-core v52's cmtime makes them:
 * ibv_create_qp on a PD of the id's device, moved with rdma_init_qp_attr + ibv_modify_qp,
 * connected with rdma_connect / rdma_accept naming the QP in conn_param.qp_num, and
 * rdma_establish on the active side once its QP is in RTS. Then a message each way.
 *
 *   extqp server ADDR     serves one connection
 *   extqp client ADDR     connects to ADDR:7471
 *
 * Exit status 0 and "extqp: ok" when every check passed; a message on stderr otherwise. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#define MSG 32

static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static struct ibv_mr *mr;
static char buf[2][MSG];

static void die(const char *what)
{
	fprintf(stderr, "extqp: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "extqp: check failed: %s\n", what);
		exit(1);
	}
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		die("rdma_get_cm_event");
	if (ev->event != type) {
		fprintf(stderr, "extqp: got %s (status %d), wanted %s\n", rdma_event_str(ev->event), ev->status,
			rdma_event_str(type));
		exit(1);
	}
	return ev;
}

/* The QP on the id's device, and its move to `state` by what rdma_init_qp_attr answers. */
static void make_qp(struct rdma_cm_id *id)
{
	pd = ibv_alloc_pd(id->verbs);
	cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!pd || !cq || !mr)
		die("pd, cq or mr");
	struct ibv_qp_init_attr attr = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	qp = ibv_create_qp(pd, &attr);
	if (!qp)
		die("ibv_create_qp");
}

static void move_qp(struct rdma_cm_id *id, enum ibv_qp_state state)
{
	struct ibv_qp_attr attr = { .qp_state = state };
	int mask;
	if (rdma_init_qp_attr(id, &attr, &mask))
		die("rdma_init_qp_attr");
	check(attr.qp_state == state && (mask & IBV_QP_STATE), "rdma_init_qp_attr names the state");
	if (state == IBV_QPS_RTR)
		check(mask & IBV_QP_DEST_QPN && mask & IBV_QP_AV && attr.ah_attr.is_global,
		      "the RTR attributes name the peer's QP and GID");
	int ret = ibv_modify_qp(qp, &attr, mask);
	if (ret) {
		errno = ret;
		die("ibv_modify_qp");
	}
	check(qp->state == state, "the QP is in the state");
}

static void post_recv(void)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf[1], .length = MSG, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		die("ibv_post_recv");
}

static void send_text(const char *text)
{
	snprintf(buf[0], MSG, "%s", text);
	struct ibv_sge sge = { .addr = (uintptr_t)buf[0], .length = (uint32_t)strlen(text) + 1, .lkey = mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 8, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	if (ibv_post_send(qp, &wr, &bad))
		die("ibv_post_send");
}

/* Two completions (the send's and the receive's, in any order), the receive holding `want`. */
static void both(const char *want)
{
	int n = 0;
	time_t until = time(NULL) + 20;
	while (n < 2) {
		struct ibv_wc wc;
		int got = ibv_poll_cq(cq, 1, &wc);
		if (got < 0)
			die("ibv_poll_cq");
		if (got == 0) {
			check(time(NULL) <= until, "completions within 20 s");
			usleep(100);
			continue;
		}
		check(wc.status == IBV_WC_SUCCESS, ibv_wc_status_str(wc.status));
		if (wc.opcode == IBV_WC_RECV)
			check(strcmp(buf[1], want) == 0, want);
		n++;
	}
}

int main(int argc, char **argv)
{
	if (argc != 3)
		return 2;
	int server = !strcmp(argv[1], "server");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(7471) };
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	if (inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1)
		return 2;
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
					 .rnr_retry_count = 7 };
	struct rdma_cm_event *ev;
	if (server) {
		if (rdma_bind_addr(id, (struct sockaddr *)&addr) || rdma_listen(id, 1))
			die("rdma_listen");
		ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		struct rdma_cm_id *child = ev->id;
		unsigned peer_qpn = ev->param.conn.qp_num;
		rdma_ack_cm_event(ev);
		make_qp(child);
		move_qp(child, IBV_QPS_INIT);
		post_recv();
		move_qp(child, IBV_QPS_RTR);
		struct ibv_qp_attr q;
		struct ibv_qp_init_attr qi;
		if (ibv_query_qp(qp, &q, IBV_QP_DEST_QPN, &qi))
			die("ibv_query_qp");
		check(q.dest_qp_num == peer_qpn, "RTR names the QP the request carried");
		move_qp(child, IBV_QPS_RTS);
		param.qp_num = qp->qp_num;
		if (rdma_accept(child, &param))
			die("rdma_accept");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
		/* The client speaks first. */
		struct ibv_wc wc;
		time_t until = time(NULL) + 20;
		int got;
		while ((got = ibv_poll_cq(cq, 1, &wc)) == 0 && time(NULL) <= until)
			usleep(100);
		check(got == 1 && wc.status == IBV_WC_SUCCESS && !strcmp(buf[1], "hello"), "the client's hello");
		post_recv();
		send_text("world");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
		rdma_disconnect(child);
		ibv_destroy_qp(qp);
		rdma_destroy_id(child);
	} else {
		if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000))
			die("rdma_resolve_addr");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
		if (rdma_resolve_route(id, 2000))
			die("rdma_resolve_route");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		make_qp(id);
		move_qp(id, IBV_QPS_INIT);
		post_recv();
		param.qp_num = qp->qp_num;
		if (rdma_connect(id, &param))
			die("rdma_connect");
		/* Without a QP of librdmacm's the active side is told of the reply, and moves its own. */
		ev = expect(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);
		rdma_ack_cm_event(ev);
		move_qp(id, IBV_QPS_RTR);
		move_qp(id, IBV_QPS_RTS);
		if (rdma_establish(id))
			die("rdma_establish");
		send_text("hello");
		both("world");
		if (rdma_disconnect(id))
			die("rdma_disconnect");
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
		ibv_destroy_qp(qp);
	}
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("extqp: ok\n");
	return 0;
}
