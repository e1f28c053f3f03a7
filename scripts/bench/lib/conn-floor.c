// conn-floor: the least a TPROXY forwarder can do per connection, as the
// floor that splitway and HAProxy are measured against (scripts/bench/bench-tproxy.sh
// method `floor`, issue #21). Never shipped: no limits, no timeouts, no
// loop guard, no crash safety (no SO_LINGER), no error reporting, no
// logging; a connection the kernel refuses is simply closed.
//
// Per connection: accept4, getsockname (the original destination), socket,
// connect, two EPOLL_CTL_ADD (edge-triggered, never modified; close
// removes them), one recv per readable event (a short read means drained,
// as splitway assumes too), send, shutdown on EOF, close. Each of WORKERS
// threads has its own epoll and its own SO_REUSEPORT listening socket, so
// nothing is shared between them.
//
// Build: cc -O2 -pthread -o conn-floor conn-floor.c
// Run:   [FLOOR_SPIN_US=N] conn-floor PORT [WORKERS]
// FLOOR_SPIN_US: poll epoll without blocking for up to N µs before each
// blocking wait (default 0: block at once), to measure what waking an idle
// thread costs.
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <pthread.h>
#include <unistd.h>
#include <time.h>

#define BUF 16384

struct conn;
struct side {
	struct conn *c;
	int i; // this side: 0 client, 1 server
};
struct conn {
	int fd[2];
	struct side side[2];
	// buf[i]: bytes read from fd[i], not yet written to fd[1 - i].
	char buf[2][BUF];
	int len[2], off[2];
	int eof[2];  // fd[i] returned EOF
	int shut[2]; // fd[1 - i] was shut down for writing
	struct conn *next_dead;
	int dead;
};

static __thread int ep; // each worker thread's own epoll
// Closed in this batch of events: freed after it, since a later event of
// the batch may still name them.
static __thread struct conn *dead;

static void conn_close(struct conn *c)
{
	close(c->fd[0]);
	close(c->fd[1]);
	c->dead = 1;
	c->next_dead = dead;
	dead = c;
}

// Moves what can move from side i to side 1 - i. Returns -1 when the
// connection is gone.
static int pump(struct conn *c, int i)
{
	int o = 1 - i;
	for (;;) {
		if (c->len[i] == 0 && !c->eof[i]) {
			ssize_t n = recv(c->fd[i], c->buf[i], BUF, 0);
			if (n < 0) {
				if (errno == EAGAIN)
					return 0;
				conn_close(c);
				return -1;
			}
			if (n == 0) {
				c->eof[i] = 1;
			} else {
				c->len[i] = (int)n;
				c->off[i] = 0;
			}
		}
		while (c->len[i] > 0) {
			ssize_t n = send(c->fd[o], c->buf[i] + c->off[i], c->len[i], MSG_NOSIGNAL);
			if (n < 0) {
				if (errno == EAGAIN)
					return 0; // the other side's EPOLLOUT resumes this
				conn_close(c);
				return -1;
			}
			c->off[i] += (int)n;
			c->len[i] -= (int)n;
		}
		if (c->eof[i]) {
			if (!c->shut[i]) {
				c->shut[i] = 1;
				if (c->eof[o] && c->len[o] == 0) {
					conn_close(c); // both ways done: close sends the FIN
					return -1;
				}
				shutdown(c->fd[o], SHUT_WR);
			}
			return 0;
		}
	}
}

static void on_event(struct side *s, uint32_t ev)
{
	struct conn *c = s->c;
	int i = s->i;
	if (c->dead)
		return;
	if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
		if (pump(c, i) < 0)
			return;
	}
	if (ev & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
		// fd[i] is writable: what the other side holds can go.
		pump(c, 1 - i);
	}
}

static void on_accept(int lfd)
{
	for (;;) {
		struct sockaddr_in dst;
		socklen_t dl = sizeof dst;
		int cfd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);
		if (cfd < 0)
			return;
		if (getsockname(cfd, (struct sockaddr *)&dst, &dl) < 0) {
			close(cfd);
			continue;
		}
		int sfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (sfd < 0) {
			close(cfd);
			continue;
		}
		if (connect(sfd, (struct sockaddr *)&dst, dl) < 0 && errno != EINPROGRESS) {
			close(sfd);
			close(cfd);
			continue;
		}
		struct conn *c = calloc(1, sizeof *c);
		c->fd[0] = cfd;
		c->fd[1] = sfd;
		for (int i = 0; i < 2; i++) {
			c->side[i].c = c;
			c->side[i].i = i;
			struct epoll_event e = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
						.data.ptr = &c->side[i]};
			epoll_ctl(ep, EPOLL_CTL_ADD, c->fd[i], &e);
		}
	}
}

static int listener(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
	setsockopt(fd, SOL_IP, IP_TRANSPARENT, &one, sizeof one);
	// Accepted sockets inherit it: no setsockopt per connection.
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4096) < 0) {
		perror("conn-floor: bind/listen");
		exit(1);
	}
	return fd;
}

static void *worker(void *arg)
{
	int lfd = listener((int)(long)arg);
	ep = epoll_create1(0);
	struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
	epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &e);
	struct epoll_event evs[256];
	long spin_ns = getenv("FLOOR_SPIN_US") ? atol(getenv("FLOOR_SPIN_US")) * 1000 : 0;
	for (;;) {
		int n = 0;
		if (spin_ns) {
			struct timespec t0, t1;
			clock_gettime(CLOCK_MONOTONIC, &t0);
			do {
				n = epoll_wait(ep, evs, 256, 0);
				if (n)
					break;
				clock_gettime(CLOCK_MONOTONIC, &t1);
			} while ((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < spin_ns);
		}
		if (n == 0)
			n = epoll_wait(ep, evs, 256, -1);
		for (int k = 0; k < n; k++) {
			if (evs[k].data.ptr == NULL)
				on_accept(lfd);
			else
				on_event(evs[k].data.ptr, evs[k].events);
		}
		while (dead) {
			struct conn *c = dead;
			dead = c->next_dead;
			free(c);
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: conn-floor PORT [WORKERS]\n");
		return 2;
	}
	int port = atoi(argv[1]);
	int workers = argc > 2 ? atoi(argv[2]) : 1;
	signal(SIGPIPE, SIG_IGN);
	pthread_t t;
	for (int w = 1; w < workers; w++)
		pthread_create(&t, NULL, worker, (void *)(long)port);
	worker((void *)(long)port);
	return 0;
}
