// TCP sockets for the server and its clients: an owning file descriptor, listening, connecting with a
// timeout, and whole reads and writes with deadlines, so that a silent or stalled peer gives an error
// instead of holding a thread forever. Failures are StoreError(Unavailable) with the OS's reason.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace recdev::net {

using Clock = std::chrono::steady_clock;

struct HostPort {
  std::string host;
  uint16_t port = 0;
};

// "HOST:PORT" (IPv4 address or name; "[::1]:7070" for IPv6). Throws StoreError(InvalidArgument).
HostPort parse_host_port(const std::string& address);
std::string format_host_port(const HostPort& address);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();

  // Reads exactly `size` bytes by `deadline`. Returns false if the peer closed the connection before
  // the first byte (a clean end between frames when `size` starts a frame); throws
  // StoreError(Unavailable) on a timeout, an error or a close in the middle.
  bool read_exact(void* out, size_t size, Clock::time_point deadline, const char* what);
  void write_all(const void* data, size_t size, Clock::time_point deadline, const char* what);
  // Waits at most `timeout` for something to read; true if there is something (or the peer closed).
  bool wait_readable(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
};

// Listens on the address (port 0: the kernel picks one); `bound` receives the actual address.
Socket listen_on(const HostPort& address, HostPort& bound, int backlog = 128);
// Accepts a connection, waiting at most `timeout`; an invalid Socket if none came.
Socket accept_connection(const Socket& listener, std::chrono::milliseconds timeout);
Socket connect_to(const HostPort& address, std::chrono::milliseconds timeout);
// TCP_NODELAY (a request is one write; do not wait for more) and keepalive (find dead peers).
void tune_connection(const Socket& socket);

}  // namespace recdev::net
