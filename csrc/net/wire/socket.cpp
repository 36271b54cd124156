#include "socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

#include "store/errors.h"

namespace recdev::net {

using store::ErrorCode;
using store::StoreError;

namespace {

[[noreturn]] void unavailable(const std::string& what, int error) {
  throw StoreError(ErrorCode::Unavailable, what + ": " + std::strerror(error));
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline, const char* what) {
  for (;;) {
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, remaining_ms(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) unavailable(what, errno);
  }
}

addrinfo* resolve(const HostPort& address, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (const int error = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); error != 0) {
    throw StoreError(ErrorCode::Unavailable,
                     "cannot resolve " + format_host_port(address) + ": " + gai_strerror(error));
  }
  return found;
}

}  // namespace

HostPort parse_host_port(const std::string& address) {
  const auto invalid = [&](const std::string& problem) {
    throw StoreError(ErrorCode::InvalidArgument,
                     "address '" + address + "' " + problem + " (expected HOST:PORT, e.g. 127.0.0.1:7070)");
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) invalid("has no host or no port");
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = address.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
    invalid("has a port that is not a number");
  }
  const unsigned long port = std::stoul(port_text);
  if (port > 65535) invalid("has a port past 65535");
  return HostPort{host, uint16_t(port)};
}

std::string format_host_port(const HostPort& address) {
  const bool ipv6 = address.host.find(':') != std::string::npos;
  return (ipv6 ? "[" + address.host + "]" : address.host) + ":" + std::to_string(address.port);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool Socket::read_exact(void* out, size_t size, Clock::time_point deadline, const char* what) {
  auto* bytes = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t got = ::recv(fd_, bytes + done, size - done, MSG_DONTWAIT);
    if (got > 0) {
      done += size_t(got);
      continue;
    }
    if (got == 0) {
      if (done == 0) return false;
      throw StoreError(ErrorCode::Unavailable, std::string("connection closed in the middle of ") + what);
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) unavailable(std::string("reading ") + what, errno);
    if (!wait_for(fd_, POLLIN, deadline, what)) {
      throw StoreError(ErrorCode::Unavailable, std::string("timed out reading ") + what);
    }
  }
  return true;
}

void Socket::write_all(const void* data, size_t size, Clock::time_point deadline, const char* what) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    const ssize_t sent = ::send(fd_, bytes + done, size - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) {
      done += size_t(sent);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) unavailable(std::string("writing ") + what, errno);
    if (!wait_for(fd_, POLLOUT, deadline, what)) {
      throw StoreError(ErrorCode::Unavailable, std::string("timed out writing ") + what);
    }
  }
}

bool Socket::wait_readable(std::chrono::milliseconds timeout) {
  return wait_for(fd_, POLLIN, Clock::now() + timeout, "waiting for a request");
}

Socket listen_on(const HostPort& address, HostPort& bound, int backlog) {
  addrinfo* candidates = resolve(address, true);
  int last_error = 0;
  Socket listener;
  for (addrinfo* candidate = candidates; candidate != nullptr; candidate = candidate->ai_next) {
    Socket attempt(::socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC, candidate->ai_protocol));
    if (!attempt.valid()) {
      last_error = errno;
      continue;
    }
    const int one = 1;
    ::setsockopt(attempt.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(attempt.fd(), candidate->ai_addr, candidate->ai_addrlen) == 0 && ::listen(attempt.fd(), backlog) == 0) {
      listener = std::move(attempt);
      break;
    }
    last_error = errno;
  }
  ::freeaddrinfo(candidates);
  if (!listener.valid()) unavailable("cannot listen on " + format_host_port(address), last_error);

  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  ::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&local), &length);
  char host[INET6_ADDRSTRLEN] = {0};
  if (local.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&local);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    bound = HostPort{host, ntohs(v6->sin6_port)};
  } else {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&local);
    ::inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    bound = HostPort{host, ntohs(v4->sin_port)};
  }
  return listener;
}

Socket accept_connection(const Socket& listener, std::chrono::milliseconds timeout) {
  if (!wait_for(listener.fd(), POLLIN, Clock::now() + timeout, "accepting")) return Socket();
  const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  // A connection reset before it was accepted, or out of descriptors: no connection this time.
  return Socket(fd);
}

Socket connect_to(const HostPort& address, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  addrinfo* candidates = resolve(address, false);
  int last_error = ETIMEDOUT;
  Socket connected;
  for (addrinfo* candidate = candidates; candidate != nullptr && !connected.valid(); candidate = candidate->ai_next) {
    Socket attempt(
        ::socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, candidate->ai_protocol));
    if (!attempt.valid()) {
      last_error = errno;
      continue;
    }
    if (::connect(attempt.fd(), candidate->ai_addr, candidate->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last_error = errno;
        continue;
      }
      if (!wait_for(attempt.fd(), POLLOUT, deadline, "connecting")) {
        last_error = ETIMEDOUT;
        continue;
      }
      int error = 0;
      socklen_t length = sizeof(error);
      ::getsockopt(attempt.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
      if (error != 0) {
        last_error = error;
        continue;
      }
    }
    connected = std::move(attempt);
  }
  ::freeaddrinfo(candidates);
  if (!connected.valid()) unavailable("cannot connect to " + format_host_port(address), last_error);
  tune_connection(connected);
  return connected;
}

void tune_connection(const Socket& socket) {
  const int one = 1;
  ::setsockopt(socket.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

}  // namespace recdev::net
