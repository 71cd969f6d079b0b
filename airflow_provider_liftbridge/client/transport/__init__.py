"""Everything that touches a socket, in one room: the gRPC channel pool (:mod:`.channels`), the
NATS connection (:mod:`.nats`: connecting, security, reconnecting, the blocking client's event
loop thread), and the two transports that run the shared operations on them (:mod:`.sync`,
:mod:`.aio`). Operations and publishers hand the transports effects (:mod:`..effects`); nothing
here imports a publisher.
"""
