#include "app/protocol/port_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace dit::protocol {

std::string probeSpec(const std::vector<std::pair<int, int>>& ranges) {
  std::string s;
  for (const auto& [lo, hi] : ranges) {
    if (!s.empty()) s += ',';
    s += std::to_string(lo) + "-" + std::to_string(hi);
  }
  return s;
}

std::vector<std::pair<int, int>> parseProbeSpec(const std::string& spec) {
  static const std::regex one("^([0-9]{1,5})-([0-9]{1,5})$");
  std::vector<std::pair<int, int>> out;
  std::istringstream in(spec);
  for (std::string part; std::getline(in, part, ',');) {
    std::smatch m;
    const int lo = std::regex_match(part, m, one) ? std::stoi(m[1]) : -1;
    const int hi = lo >= 0 ? std::stoi(m[2]) : -1;
    if (lo < 0 || hi > 65535 || hi < lo)
      throw std::invalid_argument("probe ports '" + spec +
                                  "': expected MIN-MAX[,MIN-MAX...] within 0..65535");
    out.push_back({lo, hi});
  }
  if (out.empty()) throw std::invalid_argument("probe ports '" + spec + "': no range");
  return out;
}

namespace {

// A listening IPv4 socket on the first free port of [lo, hi] (0-0: an ephemeral port); -1 when
// none is free. `port` receives the bound port.
int listenInRange(int lo, int hi, int& port) {
  for (int p = lo; p <= hi; ++p) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(p));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 4) == 0) {
      socklen_t len = sizeof a;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
      return fd;
    }
    ::close(fd);
  }
  return -1;
}

}  // namespace

int runProbeListener(const std::string& spec, double seconds) {
  std::vector<std::pair<int, int>> ranges;
  try {
    ranges = parseProbeSpec(spec);
  } catch (const std::exception& e) {
    std::printf("probe error %s\n", e.what());
    return 2;
  }
  std::vector<pollfd> fds;
  std::string ports;
  for (const auto& [lo, hi] : ranges) {
    int port = 0;
    const int fd = listenInRange(lo, hi, port);
    if (fd < 0) {
      std::printf("probe no free port in %d-%d\n", lo, hi);
      std::fflush(stdout);
      for (const pollfd& p : fds) ::close(p.fd);
      return 5;
    }
    fds.push_back(pollfd{fd, POLLIN, 0});
    ports += ' ' + std::to_string(port);
  }
  std::printf("probe listening%s\n", ports.c_str());
  std::fflush(stdout);
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  std::size_t pending = fds.size();
  while (pending > 0) {
    const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
    if (left <= 0) break;
    if (::poll(fds.data(), fds.size(), static_cast<int>(left * 1000) + 1) < 0 && errno != EINTR)
      break;
    for (pollfd& p : fds) {
      if (p.fd < 0 || !(p.revents & POLLIN)) continue;
      const int c = ::accept4(p.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      ::close(c);
      ::close(p.fd);
      p.fd = -1;  // poll ignores negative fds
      --pending;
    }
  }
  for (const pollfd& p : fds)
    if (p.fd >= 0) ::close(p.fd);
  std::printf(pending == 0 ? "probe connected\n" : "probe timeout\n");
  std::fflush(stdout);
  return pending == 0 ? 0 : 4;
}

std::string probeConnect(const std::string& host, int port, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int e = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); e != 0)
    return "cannot resolve " + host + ": " + ::gai_strerror(e);
  std::string why = "no address";
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n;
        do n = ::poll(&p, 1, static_cast<int>(timeout_s * 1000));
        while (n < 0 && errno == EINTR);
        if (n == 0) {
          ::close(fd);
          char secs[32];
          std::snprintf(secs, sizeof secs, "%.0f", timeout_s);
          why = std::string("no answer within ") + secs + " s";
          continue;
        }
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    ::close(fd);
    if (err == 0) {
      ::freeaddrinfo(res);
      return {};
    }
    why = err == ECONNREFUSED ? std::string("connection refused") : std::string(std::strerror(err));
  }
  ::freeaddrinfo(res);
  return why;
}

std::string hostNetworkAdvice() {
  return "MPI traffic between the hosts does not get through: OpenMPI may have picked an "
         "interface on a subnet the hosts share without it connecting them (a container bridge "
         "such as docker0 with the same addresses on every host). With a hostfile, name the "
         "network the hosts share with --network-interface (e.g. 10.0.0.0/24), and check that "
         "no firewall drops the ranks' TCP ports";
}

}  // namespace dit::protocol
