/* LD_PRELOAD into a process to make it another "host" to the servers it connects to: each IPv4
 * connect() to one of the ports in CDC_SOURCE_PORTS (comma-separated) is first bound to the
 * address CDC_SOURCE_ADDRESS (127.0.0.2, say; port 0), so the server sees the connection come
 * from there. librdkafka has no setting for a client's source address; tests/faults/hosts.py
 * builds this and sets the variables. Other connections (a database's, say) are left alone. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

static int listed(unsigned port) {
    const char *ports = getenv("CDC_SOURCE_PORTS");
    if (ports == NULL) return 0;
    for (const char *p = ports; *p != '\0';) {
        char *end;
        unsigned long value = strtoul(p, &end, 10);
        if (end == p) return 0;
        if (value == port) return 1;
        p = (*end == ',') ? end + 1 : end;
    }
    return 0;
}

int connect(int fd, const struct sockaddr *address, socklen_t length) {
    static connect_fn real_connect;
    if (real_connect == NULL) real_connect = (connect_fn)dlsym(RTLD_NEXT, "connect");
    const char *source = getenv("CDC_SOURCE_ADDRESS");
    if (source != NULL && address != NULL && address->sa_family == AF_INET &&
        listed(ntohs(((const struct sockaddr_in *)address)->sin_port))) {
        struct sockaddr_in local;
        memset(&local, 0, sizeof local);
        local.sin_family = AF_INET;
        if (inet_pton(AF_INET, source, &local.sin_addr) == 1)
            (void)bind(fd, (const struct sockaddr *)&local, sizeof local); /* bound already: left as it is */
    }
    return real_connect(fd, address, length);
}
