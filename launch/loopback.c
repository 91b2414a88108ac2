/* LD_PRELOAD shim: wildcard TCP binds of this process bind $JRL_BIND_ADDRESS instead.

   Reverb and courier servers listen on "[::]:port" (hard-coded in C++, no option).
   For an IPv4 address A: 0.0.0.0 becomes A, and the IPv6 wildcard of a dual-stack
   socket becomes ::ffff:A (the same IPv4 address seen from IPv6; a dual-stack
   gRPC server then listens there only). For an IPv6 address B: the IPv6 wildcard
   becomes B and 0.0.0.0 becomes 127.0.0.1 (no IPv4 form of B; still unexposed).
   The IPv6 wildcard of a v6-only socket under A fails with EADDRNOTAVAIL (gRPC then
   binds 0.0.0.0, so A). Wildcard binds still succeed, so port pickers that test a
   port on both families keep working. Binds to a specific address, non-TCP sockets
   and an unset or empty JRL_BIND_ADDRESS are left alone; an address that does not
   parse fails every wildcard bind.

   Built by launch/loopback.py: cc -shared -fPIC -O2 -o shim.so loopback.c -ldl
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

static int refuse(void) {
  errno = EADDRNOTAVAIL;
  return -1;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
  static bind_fn real_bind;
  if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
  const char *wanted = getenv("JRL_BIND_ADDRESS");
  int type = 0;
  socklen_t type_len = sizeof type;
  if (!wanted || !*wanted || !addr ||
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 || type != SOCK_STREAM)
    return real_bind(fd, addr, len);

  struct in_addr v4;
  struct in6_addr v6;
  int wants_v4 = inet_pton(AF_INET, wanted, &v4) == 1;
  int wants_v6 = !wants_v4 && inet_pton(AF_INET6, wanted, &v6) == 1;

  if (addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
    struct sockaddr_in copy;
    memcpy(&copy, addr, sizeof copy);
    if (copy.sin_addr.s_addr != htonl(INADDR_ANY)) return real_bind(fd, addr, len);
    if (!wants_v4 && !wants_v6) return refuse();
    if (wants_v4) copy.sin_addr = v4;
    else copy.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 copy;
    memcpy(&copy, addr, sizeof copy);
    int any = IN6_IS_ADDR_UNSPECIFIED(&copy.sin6_addr) ||
              (IN6_IS_ADDR_V4MAPPED(&copy.sin6_addr) && copy.sin6_addr.s6_addr32[3] == htonl(INADDR_ANY));
    if (!any) return real_bind(fd, addr, len);
    if (wants_v6) {
      copy.sin6_addr = v6;
    } else {
      int v6_only = 0;
      socklen_t opt_len = sizeof v6_only;
      if (!wants_v4 || getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6_only, &opt_len) != 0 || v6_only)
        return refuse();
      memset(&copy.sin6_addr, 0, sizeof copy.sin6_addr);
      copy.sin6_addr.s6_addr[10] = 0xff;
      copy.sin6_addr.s6_addr[11] = 0xff;
      memcpy(&copy.sin6_addr.s6_addr[12], &v4, sizeof v4);
    }
    return real_bind(fd, (const struct sockaddr *)&copy, sizeof copy);
  }
  return real_bind(fd, addr, len);
}
