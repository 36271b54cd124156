#include "metrics_http.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "metrics_format.h"
#include "store/errors.h"

namespace recdev::server {

using net::Clock;

namespace {

// After its answer, a connection is read and dropped for this long before it is closed: closing a
// socket with unread bytes resets it, which can destroy the answer before the peer has read it.
constexpr auto kLinger = std::chrono::seconds(1);

struct Client {
  enum class State { Reading, Writing, Draining };
  net::Socket socket;
  State state = State::Reading;
  Clock::time_point deadline;
  std::string in;
  std::string out;
  size_t sent = 0;
  bool done = false;
};

std::string http_response(int status, const char* reason, const std::string& content_type, const std::string& body,
                          bool head, const char* extra_header = "") {
  std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\nContent-Type: " + content_type +
                    "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n" + extra_header +
                    "Connection: close\r\n\r\n";
  if (!head) out += body;
  return out;
}

std::string error_response(int status, const char* reason, const std::string& why, bool head = false,
                           const char* extra_header = "") {
  return http_response(status, reason, "text/plain; charset=utf-8", why + "\n", head, extra_header);
}

// The answer to a whole request head (the request line and headers, which are not needed).
std::string answer(const std::string& head, net::ShardService& service) {
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  const size_t first = line.find(' ');
  const size_t second = first == std::string::npos ? first : line.find(' ', first + 1);
  if (second == std::string::npos || line.find(' ', second + 1) != std::string::npos) {
    return error_response(400, "Bad Request", "expected a request line: GET /metrics HTTP/1.1");
  }
  const std::string method = line.substr(0, first);
  const std::string target = line.substr(first + 1, second - first - 1);
  const std::string version = line.substr(second + 1);
  if (version != "HTTP/1.0" && version != "HTTP/1.1") {
    return version.rfind("HTTP/", 0) == 0
               ? error_response(505, "HTTP Version Not Supported", "this endpoint speaks HTTP/1.0 and HTTP/1.1")
               : error_response(400, "Bad Request", "expected a request line: GET /metrics HTTP/1.1");
  }
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) {
    return error_response(405, "Method Not Allowed", "only GET (and HEAD) of /metrics", false, "Allow: GET, HEAD\r\n");
  }
  if (target.substr(0, target.find('?')) != "/metrics") {
    return error_response(404, "Not Found", "the metrics are at /metrics", head_only);
  }
  const int64_t now_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  return http_response(200, "OK", "text/plain; version=0.0.4; charset=utf-8",
                       format_metrics(service.stats(), now_unix_ms), head_only);
}

// Where a request head ends (after its blank line), or npos while it has not arrived.
size_t head_end(const std::string& in) {
  const size_t crlf = in.find("\r\n\r\n");
  const size_t lf = in.find("\n\n");
  if (crlf != std::string::npos && (lf == std::string::npos || crlf + 2 < lf)) return crlf + 4;
  return lf == std::string::npos ? lf : lf + 2;
}

void respond(Client& client, std::string response) {
  client.out = std::move(response);
  client.state = Client::State::Writing;
  client.deadline = Clock::now() + MetricsEndpoint::kWriteTimeout;
}

// Reads what has arrived; answers once the head is whole, or too long.
void read_request(Client& client, net::ShardService& service) {
  char chunk[4096];
  while (true) {
    const size_t room = MetricsEndpoint::kMaxRequestBytes - client.in.size();
    const ssize_t got = ::recv(client.socket.fd(), chunk, std::min(sizeof(chunk), room), MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) {  // closed (or half-closed) before a whole request, or broken: nobody to answer
      client.done = true;
      return;
    }
    client.in.append(chunk, size_t(got));
    if (const size_t end = head_end(client.in); end != std::string::npos) {
      respond(client, answer(client.in.substr(0, end), service));
      return;
    }
    if (client.in.size() >= MetricsEndpoint::kMaxRequestBytes) {
      respond(client, error_response(431, "Request Header Fields Too Large",
                                     "the request line and headers may take " +
                                         std::to_string(MetricsEndpoint::kMaxRequestBytes) + " bytes at most"));
      return;
    }
  }
}

void write_response(Client& client) {
  while (client.sent < client.out.size()) {
    const ssize_t put = ::send(client.socket.fd(), client.out.data() + client.sent, client.out.size() - client.sent,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (put < 0) {
      client.done = true;
      return;
    }
    client.sent += size_t(put);
  }
  ::shutdown(client.socket.fd(), SHUT_WR);
  std::string().swap(client.out);
  client.state = Client::State::Draining;
  client.deadline = Clock::now() + kLinger;
}

void drain(Client& client) {
  char chunk[4096];
  while (true) {
    const ssize_t got = ::recv(client.socket.fd(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (got <= 0) {
      client.done = true;
      return;
    }
  }
}

void progress(Client& client, net::ShardService& service) {
  if (client.state == Client::State::Reading) read_request(client, service);
  if (client.done) return;
  if (client.state == Client::State::Writing) write_response(client);
  if (client.done) return;
  if (client.state == Client::State::Draining) drain(client);
}

bool loopback(const std::string& host) { return host.rfind("127.", 0) == 0 || host == "::1"; }

}  // namespace

MetricsEndpoint::MetricsEndpoint(const std::string& address) {
  try {
    listener_ = net::listen_on(net::parse_host_port(address), bound_);
  } catch (const store::StoreError& error) {
    throw std::runtime_error("--metrics-listen " + address + ": " + error.what() +
                             "; give an address of this host and a free port (port 0 picks one), e.g. "
                             "--metrics-listen 127.0.0.1:9464");
  }
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("cannot create the metrics thread's pipe");
  ::fcntl(listener_.fd(), F_SETFL, ::fcntl(listener_.fd(), F_GETFL) | O_NONBLOCK);
}

MetricsEndpoint::~MetricsEndpoint() {
  stop();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void MetricsEndpoint::start(net::ShardService& service) {
  const std::string url = "http://" + net::format_host_port(bound_) + "/metrics";
  std::fprintf(stderr, "recdev-server: metrics on %s%s\n", url.c_str(),
               loopback(bound_.host) ? "" : " (no token: whoever reaches it sees every table's name and size)");
  std::fflush(stderr);
  thread_ = std::thread([this, &service] { run(service); });
}

void MetricsEndpoint::stop() {
  if (!thread_.joinable()) return;
  const char byte = 1;
  [[maybe_unused]] const ssize_t ignored = ::write(wake_[1], &byte, 1);
  thread_.join();
}

void MetricsEndpoint::run(net::ShardService& service) {
  std::vector<Client> clients;  // oldest first
  std::vector<pollfd> entries;
  while (true) {
    entries.assign({{listener_.fd(), POLLIN, 0}, {wake_[0], POLLIN, 0}});
    Clock::time_point next_deadline = Clock::time_point::max();
    for (const Client& client : clients) {
      entries.push_back(
          pollfd{client.socket.fd(), short(client.state == Client::State::Writing ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, client.deadline);
    }
    int wait_ms = -1;
    if (!clients.empty()) {
      const auto until = std::chrono::ceil<std::chrono::milliseconds>(next_deadline - Clock::now()).count();
      wait_ms = int(std::clamp<int64_t>(until, 0, 60'000));
    }
    if (::poll(entries.data(), entries.size(), wait_ms) < 0 && errno != EINTR) continue;
    if (entries[1].revents != 0) return;
    for (size_t k = 0; k < clients.size(); ++k) {
      if (entries[2 + k].revents != 0) progress(clients[k], service);
    }
    const Clock::time_point now = Clock::now();
    for (Client& client : clients) {
      if (client.done || now < client.deadline) continue;
      if (client.state == Client::State::Reading) {  // a slow sender: told why, if it reads at once
        const std::string late = error_response(408, "Request Timeout", "the request took too long");
        [[maybe_unused]] const ssize_t ignored =
            ::send(client.socket.fd(), late.data(), late.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      }
      client.done = true;
    }
    clients.erase(std::remove_if(clients.begin(), clients.end(), [](const Client& client) { return client.done; }),
                  clients.end());
    // The connections waiting in the backlog, each read at once (its request usually came with it);
    // a round takes at most kMaxClients of them, so that a flood cannot keep the loop from the rest.
    for (size_t accepted = 0; accepted < kMaxClients; ++accepted) {
      net::Socket socket(::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!socket.valid()) break;
      if (clients.size() >= kMaxClients) clients.erase(clients.begin());  // the oldest gives way
      clients.push_back(Client{});
      clients.back().socket = std::move(socket);
      clients.back().deadline = Clock::now() + kReadTimeout;
      progress(clients.back(), service);
      if (clients.back().done) clients.pop_back();
    }
  }
}

}  // namespace recdev::server
