/*
 * Echo over the dedup channel, from C: a server thread echoes every message back; the client
 * sends the same 1 MiB message twice, checks each echo, and prints its counters. The second
 * round travels almost entirely as chunk references. The channel is encrypted and authenticated
 * with a key both ends share: 64 hexadecimal digits (`dedupwire key generate`) or a passphrase
 * of 16+ characters, here $DEDUPWIRE_KEY or a built-in passphrase.
 *
 * Usage: echo DIR   (the two chunk stores go in DIR/server and DIR/client)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dedupwire.h"

#define MESSAGE_LEN (1u << 20)
#define ROUNDS 2

static int fail(const char *what, int status) {
  fprintf(stderr, "echo: %s failed (%d): %s\n", what, status, dw_last_error());
  return 1;
}

static void *serve(void *arg) {
  dw_listener *listener = arg;
  dw_stream *stream = NULL;
  int status = dw_accept(listener, &stream);
  if (status != DW_OK) {
    fail("dw_accept", status);
    return (void *)1;
  }
  for (int i = 0; i < ROUNDS; i++) {
    uint8_t *data = NULL;
    size_t len = 0;
    if ((status = dw_recv(stream, &data, &len)) != DW_OK) {
      fail("server dw_recv", status);
      dw_close(stream);
      return (void *)1;
    }
    status = dw_send(stream, data, len);
    dw_buf_free(data, len);
    if (status != DW_OK) {
      fail("server dw_send", status);
      dw_close(stream);
      return (void *)1;
    }
  }
  if ((status = dw_close(stream)) != DW_OK) {
    fail("server dw_close", status);
    return (void *)1;
  }
  return NULL;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char server_dir[4096], client_dir[4096], addr[64];
  snprintf(server_dir, sizeof server_dir, "%s/server", argv[1]);
  snprintf(client_dir, sizeof client_dir, "%s/client", argv[1]);

  const char *key = getenv("DEDUPWIRE_KEY");
  if (key == NULL) key = "the echo example's shared passphrase";

  dw_env *server_env = NULL, *client_env = NULL;
  dw_listener *listener = NULL;
  int status;
  if ((status = dw_env_open(server_dir, 0, &server_env)) != DW_OK) return fail("dw_env_open", status);
  if ((status = dw_env_open(client_dir, 0, &client_env)) != DW_OK) return fail("dw_env_open", status);
  if ((status = dw_listen("127.0.0.1:0", server_env, key, &listener)) != DW_OK) return fail("dw_listen", status);
  dw_env_free(server_env);
  if ((status = dw_listener_local_addr(listener, addr, sizeof addr)) != DW_OK)
    return fail("dw_listener_local_addr", status);

  pthread_t server;
  if (pthread_create(&server, NULL, serve, listener) != 0) {
    fprintf(stderr, "echo: pthread_create failed\n");
    return 1;
  }

  uint8_t *message = malloc(MESSAGE_LEN);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < MESSAGE_LEN; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    message[i] = (uint8_t)x;
  }

  dw_stream *client = NULL;
  if ((status = dw_connect_mode(addr, client_env, key, DW_MODE_DEDUP, &client)) != DW_OK)
    return fail("dw_connect_mode", status);
  dw_env_free(client_env);
  for (int i = 0; i < ROUNDS; i++) {
    if ((status = dw_send(client, message, MESSAGE_LEN)) != DW_OK) return fail("dw_send", status);
    uint8_t *echoed = NULL;
    size_t len = 0;
    if ((status = dw_recv(client, &echoed, &len)) != DW_OK) return fail("dw_recv", status);
    int same = len == MESSAGE_LEN && memcmp(echoed, message, len) == 0;
    dw_buf_free(echoed, len);
    if (!same) {
      fprintf(stderr, "echo: round %d came back different (%zu bytes)\n", i + 1, len);
      return 1;
    }
  }

  dw_stats stats;
  if ((status = dw_stream_stats(client, &stats)) != DW_OK) return fail("dw_stream_stats", status);
  if ((status = dw_close(client)) != DW_OK) return fail("dw_close", status);
  void *served = NULL;
  pthread_join(server, &served);
  dw_listener_free(listener);
  free(message);
  if (served != NULL) return 1;

  printf("stats: messages_sent=%llu message_bytes_sent=%llu socket_bytes_sent=%llu "
         "socket_bytes_received=%llu chunks_hit=%llu bytes_hit=%llu chunks_delta=%llu "
         "chunks_literal=%llu\n",
         (unsigned long long)stats.messages_sent, (unsigned long long)stats.message_bytes_sent,
         (unsigned long long)stats.socket_bytes_sent,
         (unsigned long long)stats.socket_bytes_received, (unsigned long long)stats.chunks_hit,
         (unsigned long long)stats.bytes_hit, (unsigned long long)stats.chunks_delta,
         (unsigned long long)stats.chunks_literal);
  printf("echo: ok\n");
  return 0;
}
