/*
 * A program that forks after it has attached to the fabric.
 *
 *   fork child-calls ADDR    the child writes forged requests on every socket it inherited
 *                            (the daemon must refuse them: it is not its parent), then uses
 *                            the library, which attaches it as a process of its own; the
 *                            parent, after the child, finds its id intact and its socket in
 *                            step
 *   fork parent-exits ADDR   the parent registers a region and exits at once; the child holds
 *                            the inherited sockets, waits, then attaches as itself: the daemon
 *                            must have seen the parent go before the child arrives
 *
 * Prints "parent PID" and "child PID" (in that order), then "ok" from each side that passed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int check(int ok, const char *what)
{
	if (!ok)
		fprintf(stderr, "check failed: %s (errno %d)\n", what, errno);
	return !ok;
}

static void addr_of(const char *ip, struct sockaddr_in *sin)
{
	memset(sin, 0, sizeof *sin);
	sin->sin_family = AF_INET;
	inet_pton(AF_INET, ip, &sin->sin_addr);
}

/* Sends a request on every inherited Unix socket: op 6 (DestroyId) with a made-up id, and an
 * empty datagram. The daemon must neither act on them nor answer them on the parent's socket. */
static void forge_on_inherited_sockets(void)
{
	unsigned char req[12] = { 6, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0 };
	struct stat st;
	int fd;

	for (fd = 3; fd < 256; fd++)
		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) {
			(void)send(fd, req, sizeof req, MSG_DONTWAIT | MSG_NOSIGNAL);
			(void)send(fd, req, 0, MSG_DONTWAIT | MSG_NOSIGNAL);
		}
}

static void hold_inherited_sockets(void)
{
	struct stat st;
	int fd;

	for (fd = 3; fd < 256; fd++)
		if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode))
			(void)dup(fd);
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch, *own;
	struct rdma_cm_id *id, *child_id;
	struct sockaddr_in sin;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	static char region[4096];
	int bad = 0, status;
	pid_t child;

	if (argc != 3)
		return 2;
	ch = rdma_create_event_channel();
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return check(0, "parent attaches");
	printf("parent %d\n", (int)getpid());
	fflush(stdout);

	if (!strcmp(argv[1], "parent-exits")) {
		addr_of(argv[2], &sin);
		if (rdma_bind_addr(id, (struct sockaddr *)&sin))
			return check(0, "parent binds");
		pd = ibv_alloc_pd(id->verbs);
		mr = pd ? ibv_reg_mr(pd, region, sizeof region, IBV_ACCESS_LOCAL_WRITE |
				     IBV_ACCESS_REMOTE_WRITE) : NULL;
		if (!mr)
			return check(0, "parent registers a region");
		child = fork();
		if (child < 0)
			return check(0, "fork");
		if (child > 0)
			_exit(0); /* no exit handlers: the sockets stay open in the child */
		/* Copies of every inherited socket, kept open till the end: the library closes its
		 * own copy when it attaches the child, and the parent's exit must be seen anyway. */
		hold_inherited_sockets();
		sleep(1);
		printf("child %d\n", (int)getpid());
		fflush(stdout);
		own = rdma_create_event_channel();
		bad |= check(own != NULL, "the child attaches as itself after its parent went");
		if (own)
			rdma_destroy_event_channel(own);
		printf("child: %s\n", bad ? "FAILED" : "ok");
		return bad;
	}

	child = fork();
	if (child < 0)
		return check(0, "fork");
	if (child == 0) {
		printf("child %d\n", (int)getpid());
		fflush(stdout);
		forge_on_inherited_sockets();
		own = rdma_create_event_channel();
		bad |= check(own != NULL, "the child makes a channel of its own");
		bad |= check(own && rdma_create_id(own, &child_id, NULL, RDMA_PS_TCP) == 0,
			     "the child makes an id of its own");
		addr_of(argv[2], &sin);
		errno = 0;
		bad |= check(rdma_bind_addr(id, (struct sockaddr *)&sin) != 0,
			     "the parent's id is not the child's to use");
		if (own) {
			rdma_destroy_id(child_id);
			rdma_destroy_event_channel(own);
		}
		printf("child: %s\n", bad ? "FAILED" : "ok");
		fflush(stdout);
		_exit(bad);
	}
	if (waitpid(child, &status, 0) != child)
		return check(0, "waitpid");
	bad |= check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child passed");
	addr_of(argv[2], &sin);
	bad |= check(rdma_bind_addr(id, (struct sockaddr *)&sin) == 0,
		     "the parent's id survives its child's forged requests");
	bad |= check(rdma_destroy_id(id) == 0, "the parent destroys its id");
	rdma_destroy_event_channel(ch);
	printf("parent: %s\n", bad ? "FAILED" : "ok");
	return bad;
}
