/*
 * A program's own kernel sockets between simulated hosts, as ibv_rc_pingpong, perftest and
 * qperf keep one beside RDMA. Run under cmsim-run on a fabric host:
 *
 *   side tcp-server ADDR PORT   bind ADDR (an address, "any" or "any6"), accept one client,
 *                               answer its line "ping" with "pong"
 *   side tcp-client ADDR PORT   connect (retrying while refused, at most 10 s), send "ping"
 *   side udp-server ADDR PORT   answer one datagram (recvmsg/sendmsg) with "pong"
 *   side udp-client ADDR PORT   sendto from an unbound socket, recvfrom the answer
 *   side udp-mmsg-client ADDR PORT  the same with sendmmsg and recvmmsg
 *   side refused ADDR PORT      one connect, which must be refused
 *   side bind ADDR PORT         one bind, printing its errno
 *   side bind-v6only ADDR PORT  the same on an AF_INET6 socket with IPV6_V6ONLY set
 *   side ifaddrs any 0          getifaddrs' list, one "ifaddr NAME FLAGS ADDR MASK BCAST" line
 *                               an entry (flags in hex, "-" for no broadcast address)
 *
 * Each prints the addresses it sees (getsockname, getpeername, accept's, recvfrom's) as
 * "what ADDR:PORT" lines; every wait is bounded (alarm).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *show(const struct sockaddr_storage *ss)
{
	static char out[4][80];
	static int which;
	char ip[INET6_ADDRSTRLEN];
	char *o = out[which++ & 3];

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s = (const void *)ss;

		inet_ntop(AF_INET, &s->sin_addr, ip, sizeof(ip));
		snprintf(o, 80, "%s:%d", ip, ntohs(s->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const void *)ss;

		inet_ntop(AF_INET6, &s->sin6_addr, ip, sizeof(ip));
		snprintf(o, 80, "[%s]:%d", ip, ntohs(s->sin6_port));
	} else {
		snprintf(o, 80, "family-%d", ss->ss_family);
	}
	return o;
}

static socklen_t parse(const char *addr, const char *port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (!strcmp(addr, "any6") || strchr(addr, ':')) {
		struct sockaddr_in6 *s = (void *)ss;

		s->sin6_family = AF_INET6;
		s->sin6_port = htons(atoi(port));
		if (strcmp(addr, "any6") && inet_pton(AF_INET6, addr, &s->sin6_addr) != 1)
			exit(2);
		return sizeof(*s);
	} else {
		struct sockaddr_in *s = (void *)ss;

		s->sin_family = AF_INET;
		s->sin_port = htons(atoi(port));
		if (strcmp(addr, "any") && inet_pton(AF_INET, addr, &s->sin_addr) != 1)
			exit(2);
		return sizeof(*s);
	}
}

static void names(int fd, const char *what)
{
	struct sockaddr_storage a, b;
	socklen_t la = sizeof(a), lb = sizeof(b);

	if (getsockname(fd, (void *)&a, &la))
		perror("getsockname");
	if (getpeername(fd, (void *)&b, &lb))
		perror("getpeername");
	printf("%s local %s peer %s\n", what, show(&a), show(&b));
}

int main(int argc, char **argv)
{
	struct sockaddr_storage ss, from;
	socklen_t len, flen = sizeof(from);
	char buf[64];
	int fd, c, one = 1;
	ssize_t n;

	if (argc != 4)
		return 2;
	alarm(20);
	setvbuf(stdout, NULL, _IONBF, 0);
	len = parse(argv[2], argv[3], &ss);
	if (!strcmp(argv[1], "tcp-server")) {
		fd = socket(ss.ss_family, SOCK_STREAM, 0);
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (void *)&ss, len) || listen(fd, 1)) {
			perror("bind/listen");
			return 1;
		}
		len = sizeof(ss);
		getsockname(fd, (void *)&ss, &len);
		printf("listening %s\n", show(&ss));
		c = accept(fd, (void *)&from, &flen);
		if (c < 0) {
			perror("accept");
			return 1;
		}
		printf("accepted %s\n", show(&from));
		names(c, "server");
		n = read(c, buf, sizeof(buf) - 1);
		if (n != 5 || memcmp(buf, "ping\n", 5))
			return 1;
		if (write(c, "pong\n", 5) != 5)
			return 1;
		close(c);
		return 0;
	}
	if (!strcmp(argv[1], "tcp-client")) {
		struct timespec pause = { 0, 10 * 1000 * 1000 };
		int tries;

		for (tries = 0; tries < 1000; tries++) {
			fd = socket(ss.ss_family, SOCK_STREAM, 0);
			if (!connect(fd, (void *)&ss, len))
				break;
			if (errno != ECONNREFUSED) {
				perror("connect");
				return 1;
			}
			close(fd);
			nanosleep(&pause, NULL);
		}
		names(fd, "client");
		if (write(fd, "ping\n", 5) != 5)
			return 1;
		n = read(fd, buf, sizeof(buf) - 1);
		if (n < 0)
			return 1;
		buf[n] = 0;
		printf("got %s", buf);
		return strcmp(buf, "pong\n") != 0;
	}
	if (!strcmp(argv[1], "udp-server")) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr m = { 0 };

		fd = socket(ss.ss_family, SOCK_DGRAM, 0);
		if (bind(fd, (void *)&ss, len)) {
			perror("bind");
			return 1;
		}
		len = sizeof(ss);
		getsockname(fd, (void *)&ss, &len);
		printf("bound %s\n", show(&ss));
		m.msg_name = &from;
		m.msg_namelen = sizeof(from);
		m.msg_iov = &iov;
		m.msg_iovlen = 1;
		n = recvmsg(fd, &m, 0);
		if (n != 4 || memcmp(buf, "ping", 4))
			return 1;
		printf("datagram from %s\n", show(&from));
		memcpy(buf, "pong", 4);
		iov.iov_len = 4;
		return sendmsg(fd, &m, 0) != 4;
	}
	if (!strcmp(argv[1], "udp-client")) {
		struct timeval wait = { 0, 100 * 1000 };
		int tries;

		fd = socket(ss.ss_family, SOCK_DGRAM, 0);
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
		/* The server may not be bound yet: a datagram sent before is lost, so say it again. */
		for (tries = 0, n = -1; tries < 100 && n < 0; tries++) {
			if (sendto(fd, "ping", 4, 0, (void *)&ss, len) != 4) {
				perror("sendto");
				return 1;
			}
			n = recvfrom(fd, buf, sizeof(buf), 0, (void *)&from, &flen);
		}
		if (n != 4 || memcmp(buf, "pong", 4))
			return 1;
		printf("answer from %s\n", show(&from));
		len = sizeof(ss);
		getsockname(fd, (void *)&ss, &len);
		printf("client local %s\n", show(&ss));
		return 0;
	}
	if (!strcmp(argv[1], "udp-mmsg-client")) {
		struct timeval wait = { 0, 100 * 1000 };
		struct iovec out = { "ping", 4 }, in = { buf, sizeof(buf) };
		struct mmsghdr sm, rm;
		int tries, got = 0;

		memset(&sm, 0, sizeof(sm));
		memset(&rm, 0, sizeof(rm));
		sm.msg_hdr.msg_name = &ss;
		sm.msg_hdr.msg_namelen = len;
		sm.msg_hdr.msg_iov = &out;
		sm.msg_hdr.msg_iovlen = 1;
		rm.msg_hdr.msg_name = &from;
		rm.msg_hdr.msg_iov = &in;
		rm.msg_hdr.msg_iovlen = 1;
		fd = socket(ss.ss_family, SOCK_DGRAM, 0);
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
		for (tries = 0; tries < 100 && got != 1; tries++) {
			if (sendmmsg(fd, &sm, 1, 0) != 1 || sm.msg_len != 4) {
				perror("sendmmsg");
				return 1;
			}
			rm.msg_hdr.msg_namelen = sizeof(from);
			got = recvmmsg(fd, &rm, 1, 0, NULL);
		}
		if (got != 1 || rm.msg_len != 4 || memcmp(buf, "pong", 4))
			return 1;
		printf("answer from %s\n", show(&from));
		len = sizeof(ss);
		getsockname(fd, (void *)&ss, &len);
		printf("client local %s\n", show(&ss));
		return 0;
	}
	if (!strcmp(argv[1], "ifaddrs")) {
		struct ifaddrs *list, *i;

		if (getifaddrs(&list)) {
			perror("getifaddrs");
			return 1;
		}
		for (i = list; i; i = i->ifa_next) {
			if (!i->ifa_addr)
				continue;
			printf("ifaddr %s %x %s %s %s\n", i->ifa_name, i->ifa_flags,
			       show((void *)i->ifa_addr), show((void *)i->ifa_netmask),
			       i->ifa_broadaddr ? show((void *)i->ifa_broadaddr) : "-");
		}
		freeifaddrs(list);
		return 0;
	}
	if (!strcmp(argv[1], "refused")) {
		fd = socket(ss.ss_family, SOCK_STREAM, 0);
		if (!connect(fd, (void *)&ss, len))
			return 1;
		printf("connect: %s\n", errno == ECONNREFUSED ? "ECONNREFUSED" : strerror(errno));
		return 0;
	}
	if (!strcmp(argv[1], "bind") || !strcmp(argv[1], "bind-v6only")) {
		fd = socket(ss.ss_family, SOCK_STREAM, 0);
		if (!strcmp(argv[1], "bind-v6only"))
			setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
		if (!bind(fd, (void *)&ss, len)) {
			len = sizeof(ss);
			getsockname(fd, (void *)&ss, &len);
			printf("bind: bound %s\n", show(&ss));
		} else {
			printf("bind: %s\n", errno == EADDRNOTAVAIL ? "EADDRNOTAVAIL" : strerror(errno));
		}
		return 0;
	}
	return 2;
}
