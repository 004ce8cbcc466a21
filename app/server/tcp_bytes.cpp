// The bytes a TCP socket has received (TCP_INFO's tcpi_bytes_received, Linux 4.1+), in a file of
// its own: <linux/tcp.h> has it, and conflicts with the <netinet/tcp.h> that cpp-httplib includes.
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace dit::server {

std::optional<std::uint64_t> tcpBytesReceived(int fd) {
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
    return std::nullopt;
  return ti.tcpi_bytes_received;
}

}  // namespace dit::server
