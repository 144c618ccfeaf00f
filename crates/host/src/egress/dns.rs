//! Moat's DNS inside a server's namespace: a listed name gets its relay
//! address, any other is NXDOMAIN, recorded.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use super::normalize;
use super::shares::Recorder;

/// How long an answer says it may be cached.
const DNS_TTL: u32 = 60;

/// Answers DNS on `socket` for `names`, each with its relay address, and
/// refuses every other name (NXDOMAIN), recording it.
pub(super) async fn serve_dns(
    socket: tokio::net::UdpSocket,
    names: HashMap<String, Ipv4Addr>,
    recorder: Arc<Recorder>,
) {
    let mut buffer = vec![0u8; 4096];
    loop {
        let (length, from) = match socket.recv_from(&mut buffer).await {
            Ok(received) => received,
            Err(error) => {
                tracing::debug!(server = %recorder.server, %error, "DNS receive failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some((reply, refused)) = answer_dns(&buffer[..length], &names) {
            if let Some(name) = refused {
                recorder.refused(
                    &name,
                    "not in this server's net grants (DNS answered NXDOMAIN)",
                );
            }
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

/// The reply to one DNS query: an A record with its relay address for a
/// listed name (no records for other types), NXDOMAIN for any other name
/// (with that name, to record, unless it is a reverse lookup), FORMERR for
/// a query that is not exactly one question. `None` for what is not a
/// query.
pub(super) fn answer_dns(
    query: &[u8],
    names: &HashMap<String, Ipv4Addr>,
) -> Option<(Vec<u8>, Option<String>)> {
    use simple_dns::rdata::{A, RData};
    use simple_dns::{CLASS, Packet, PacketFlag, QTYPE, RCODE, ResourceRecord, TYPE};
    let packet = Packet::parse(query).ok()?;
    if packet.has_flags(PacketFlag::RESPONSE) {
        return None;
    }
    let mut reply = Packet::new_reply(packet.id());
    if packet.has_flags(PacketFlag::RECURSION_DESIRED) {
        reply.set_flags(PacketFlag::RECURSION_DESIRED | PacketFlag::RECURSION_AVAILABLE);
    }
    let [question] = packet.questions.as_slice() else {
        *reply.rcode_mut() = RCODE::FormatError;
        return Some((reply.build_bytes_vec().ok()?, None));
    };
    reply.questions.push(question.clone());
    let name = normalize(&question.qname.to_string());
    let mut refused = None;
    match names.get(&name) {
        None => {
            *reply.rcode_mut() = RCODE::NameError;
            if !name.ends_with(".arpa") {
                refused = Some(name);
            }
        }
        Some(address) => {
            if matches!(question.qtype, QTYPE::TYPE(TYPE::A) | QTYPE::ANY) {
                reply.answers.push(ResourceRecord::new(
                    question.qname.clone(),
                    CLASS::IN,
                    DNS_TTL,
                    RData::A(A::from(*address)),
                ));
            }
        }
    }
    Some((reply.build_bytes_vec().ok()?, refused))
}
