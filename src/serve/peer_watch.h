// PeerWatch: tells whether the client of an in-flight HTTP request has gone away, so its work can
// be cancelled even while nothing is being written (a non-streaming request, or a stream still
// queued). cpp-httplib 0.11 does not hand handlers their socket, so the socket is found once by
// matching the connection's local port and peer address among this process's descriptors; the
// connection's worker thread keeps it open for as long as the handler (or its content provider)
// runs. Not thread-safe; cheap to poll (one poll(2) with zero timeout).
#pragma once

#include <string>

namespace ember::serve {

class PeerWatch {
 public:
  PeerWatch(const std::string& remote_addr, int remote_port, int local_port);
  // True when the peer closed or reset the connection. False when the socket was not found.
  bool PeerGone() const;
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace ember::serve
