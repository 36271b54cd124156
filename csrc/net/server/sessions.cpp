#include "sessions.h"

#include "store/errors.h"

namespace recdev::net {

Sessions::Sessions(double lease_seconds) : lease_seconds_(lease_seconds), random_(std::random_device{}()) {}

std::shared_ptr<Session> Sessions::attach(uint64_t session_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<Session> session;
  if (session_id == 0) {
    // Random, so that one client cannot stumble into another's session by counting.
    uint64_t id;
    do {
      id = random_();
    } while (id == 0 || sessions_.count(id) != 0);
    session = sessions_.emplace(id, std::make_shared<Session>(id)).first->second;
  } else {
    const auto found = sessions_.find(session_id);
    if (found == sessions_.end()) {
      throw store::StoreError(store::ErrorCode::NotFound,
                              "session " + std::to_string(session_id) +
                                  " does not exist or its lease lapsed (its anonymous tables were freed); "
                                  "connect with session_id 0 to start a new one");
    }
    session = found->second;
  }
  ++session->connections;
  session->last_active = Clock::now();
  return session;
}

void Sessions::detach(Session& session) {
  std::lock_guard<std::mutex> lock(mutex_);
  --session.connections;
  session.last_active = Clock::now();
}

void Sessions::touch(Session& session) {
  std::lock_guard<std::mutex> lock(mutex_);
  session.last_active = Clock::now();
}

std::vector<std::shared_ptr<Session>> Sessions::take_lapsed() {
  const auto lease = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lease_seconds_));
  const Clock::time_point now = Clock::now();
  std::vector<std::shared_ptr<Session>> lapsed;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second->connections == 0 && now - it->second->last_active > lease) {
      lapsed.push_back(std::move(it->second));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  return lapsed;
}

size_t Sessions::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sessions_.size();
}

}  // namespace recdev::net
