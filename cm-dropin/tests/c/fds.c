/*
 * The channel fds are real fds whose readiness means "an event is queued": an empty
 * O_NONBLOCK event channel answers EAGAIN and polls as not readable; a queued event makes it
 * readable; the same holds for a completion channel armed with ibv_req_notify_cq.
 *
 *   fds server ADDR     accepts one connection, receives one message
 *   fds client ADDR     connects and sends one message
 *
 * Exit status 0 when every check passed.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int bad;

static void check(int ok, const char *what)
{
	if (!ok) {
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
		bad = 1;
	}
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* Waits for the next event of the channel with poll, then takes it without blocking. */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev = NULL;

	check(readable(ch->fd, 10000), "an event makes the channel fd readable");
	check(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event on a readable O_NONBLOCK fd");
	if (ev && ev->event != want) {
		fprintf(stderr, "got %s, wanted %s\n", rdma_event_str(ev->event), rdma_event_str(want));
		bad = 1;
	}
	return ev;
}

int main(int argc, char **argv)
{
	struct rdma_addrinfo hints, *res;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id, *listen_id = NULL;
	struct rdma_cm_event *ev;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq, *ev_cq;
	struct ibv_qp_init_attr attr;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct ibv_recv_wr rwr = { 0 }, *bad_rwr;
	struct ibv_send_wr swr = { 0 }, *bad_swr;
	struct ibv_wc wc;
	static char buf[64];
	void *ev_ctx;
	int server;
	unsigned int req_qpn = 0, sent_qpn = 0;

	if (argc != 3)
		return 2;
	server = !strcmp(argv[1], "server");
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(argv[2], "7471", &hints, &res))
		return perror("rdma_getaddrinfo"), 1;

	ch = rdma_create_event_channel();
	if (!ch)
		return perror("rdma_create_event_channel"), 1;
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	check(!readable(ch->fd, 0), "an empty channel's fd is not readable");
	check(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN, "an empty O_NONBLOCK channel answers EAGAIN");

	if (server) {
		if (rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) || rdma_bind_addr(listen_id, res->ai_src_addr) ||
		    rdma_listen(listen_id, 1))
			return perror("listen"), 1;
		ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		if (!ev)
			return 1;
		id = ev->id;
		req_qpn = ev->param.conn.qp_num;
		rdma_ack_cm_event(ev);
	} else {
		if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) ||
		    rdma_resolve_addr(id, NULL, res->ai_dst_addr, 2000))
			return perror("resolve"), 1;
		ev = next_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
		rdma_ack_cm_event(ev);
		check(!readable(ch->fd, 0), "an acked, drained channel is not readable");
		if (rdma_resolve_route(id, 2000))
			return perror("rdma_resolve_route"), 1;
		ev = next_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
		rdma_ack_cm_event(ev);
	}

	pd = ibv_alloc_pd(id->verbs);
	cc = ibv_create_comp_channel(id->verbs);
	cq = cc ? ibv_create_cq(id->verbs, 4, buf, cc, 0) : NULL;
	if (!pd || !cq)
		return perror("verbs"), 1;
	fcntl(cc->fd, F_SETFL, fcntl(cc->fd, F_GETFL) | O_NONBLOCK);
	check(ibv_get_cq_event(cc, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "an empty O_NONBLOCK completion channel answers EAGAIN");
	memset(&attr, 0, sizeof attr);
	attr.cap.max_send_wr = attr.cap.max_recv_wr = 2;
	attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
	attr.send_cq = attr.recv_cq = cq;
	attr.sq_sig_all = 1;
	attr.qp_type = IBV_QPT_RC;
	if (rdma_create_qp(id, pd, &attr))
		return perror("rdma_create_qp"), 1;
	mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		return perror("ibv_reg_mr"), 1;
	sge.addr = (uintptr_t)buf;
	sge.length = sizeof buf;
	sge.lkey = mr->lkey;
	check(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");

	if (server) {
		rwr.sg_list = &sge;
		rwr.num_sge = 1;
		rwr.wr_id = 5;
		if (ibv_post_recv(id->qp, &rwr, &bad_rwr) || rdma_accept(id, NULL))
			return perror("accept"), 1;
		ev = next_event(ch, RDMA_CM_EVENT_ESTABLISHED);
		rdma_ack_cm_event(ev);
		check(readable(cc->fd, 10000), "a completion makes the armed CQ's channel fd readable");
		check(ibv_get_cq_event(cc, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == buf,
		      "ibv_get_cq_event gives back the CQ and its context");
		ibv_ack_cq_events(cq, 1);
		check(ibv_poll_cq(cq, 1, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5 &&
			      wc.opcode == IBV_WC_RECV && sscanf(buf, "over the fd %u", &sent_qpn) == 1,
		      "the receive completes with the message");
		check(sent_qpn == req_qpn, "CONNECT_REQUEST reported the requester's ibv_qp.qp_num");
		check(!readable(cc->fd, 0), "one completion raised one event");
		ev = next_event(ch, RDMA_CM_EVENT_DISCONNECTED);
		rdma_ack_cm_event(ev);
	} else {
		if (rdma_connect(id, NULL))
			return perror("rdma_connect"), 1;
		ev = next_event(ch, RDMA_CM_EVENT_ESTABLISHED);
		check(ev && ev->param.conn.qp_num != 0 && ev->param.conn.qp_num != id->qp->qp_num,
		      "ESTABLISHED reports the peer's QP number");
		rdma_ack_cm_event(ev);
		/* The message carries the client's QP number: the server compares it with the one
		 * its CONNECT_REQUEST reported. */
		snprintf(buf, sizeof buf, "over the fd %u", id->qp->qp_num);
		swr.sg_list = &sge;
		swr.num_sge = 1;
		swr.opcode = IBV_WR_SEND;
		swr.wr_id = 6;
		if (ibv_post_send(id->qp, &swr, &bad_swr))
			return perror("ibv_post_send"), 1;
		check(readable(cc->fd, 10000), "the send's completion makes the channel fd readable");
		check(ibv_get_cq_event(cc, &ev_cq, &ev_ctx) == 0 && ev_cq == cq, "ibv_get_cq_event");
		ibv_ack_cq_events(cq, 1);
		check(ibv_poll_cq(cq, 1, &wc) == 1 && wc.wr_id == 6 && wc.opcode == IBV_WC_SEND,
		      "the send completes");
		rdma_disconnect(id);
	}
	printf("%s: %s\n", argv[1], bad ? "FAILED" : "ok");
	return bad;
}
