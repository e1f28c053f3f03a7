// SPDX-License-Identifier: Apache-2.0
// The floor of scripts/bench/footprint-binaries.py's exec -> READY=1 timing: a C
// program that listens on the footprint config's port and sends READY=1 to
// NOTIFY_SOCKET, nothing else. Its arguments are ignored.
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(void) {
    int one = 1, s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(17000),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un u = {.sun_family = AF_UNIX};
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 4096) || !path ||
        strlen(path) >= sizeof u.sun_path) {
        perror("listen-floor");
        return 1;
    }
    strcpy(u.sun_path, path);
    int n = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (sendto(n, "READY=1", 7, 0, (struct sockaddr *)&u, sizeof u) != 7) {
        perror("listen-floor: NOTIFY_SOCKET");
        return 1;
    }
    pause();
    return 0;
}
