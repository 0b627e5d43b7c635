/*
 * rdma_migrate_id, as libfabric's verbs provider calls it when it binds an id to an event
 * queue: the id's events go to the new channel; a NULL channel makes the id synchronous.
 * Run under cmsim-run on host ADDR: migrate ADDR
 *
 * Prints "ok" and exits 0 when every check passed; a message on stderr otherwise.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
	return !ok;
}

/* Whether fd becomes readable within ms milliseconds. */
static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, ms) == 1;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *one, *two;
	struct rdma_cm_id *id, *sync_id;
	struct rdma_cm_event *ev;
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7471) };
	int bad = 0;

	if (argc != 2 || inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1)
		return 2;
	one = rdma_create_event_channel();
	two = rdma_create_event_channel();
	if (!one || !two || rdma_create_id(one, &id, NULL, RDMA_PS_TCP))
		return 1;
	bad |= check(rdma_migrate_id(id, two) == 0 && id->channel == two, "migrate to another channel");
	bad |= check(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0, "resolve_addr");
	bad |= check(readable(two->fd, 5000), "the event comes on the new channel");
	bad |= check(!readable(one->fd, 100), "and not on the old one");
	if (!bad) {
		bad |= check(rdma_get_cm_event(two, &ev) == 0 && ev->id == id &&
				     ev->event == RDMA_CM_EVENT_ADDR_RESOLVED,
			     "ADDR_RESOLVED on the new channel");
		if (!bad)
			rdma_ack_cm_event(ev);
	}
	/* NULL: a channel of the id's own, synchronous from now on. */
	bad |= check(rdma_migrate_id(id, NULL) == 0 && id->channel && id->channel != two &&
			     id->channel != one,
		     "migrate to a channel of its own");
	bad |= check(rdma_resolve_route(id, 2000) == 0, "a synchronous resolve_route returns done");
	bad |= check(!readable(two->fd, 100), "nothing on the channel it left");
	/* A synchronous id cannot be made synchronous again. */
	bad |= check(rdma_create_id(NULL, &sync_id, NULL, RDMA_PS_TCP) == 0, "a synchronous id");
	errno = 0;
	bad |= check(rdma_migrate_id(sync_id, NULL) == -1 && errno == EINVAL,
		     "migrating a synchronous id to NULL is EINVAL");
	bad |= check(rdma_migrate_id(sync_id, one) == 0 && sync_id->channel == one,
		     "a synchronous id moves to a channel");
	bad |= check(rdma_destroy_id(sync_id) == 0 && rdma_destroy_id(id) == 0, "destroy the ids");
	rdma_destroy_event_channel(one);
	rdma_destroy_event_channel(two);
	printf("%s\n", bad ? "FAILED" : "ok");
	return bad;
}
