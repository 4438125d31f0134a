//! A dashboard that resumes its stream: after any failure it reconnects with Last-Event-ID and
//! shows each event once, in order.
use futures::StreamExt;
use tidemark_client::{Client, StreamOptions};

#[tokio::main]
async fn main() -> Result<(), tidemark_client::Error> {
    let url = std::env::var("TIDEMARK_URL").unwrap_or_else(|_| "http://127.0.0.1:7700".into());
    let client = Client::new(url, std::env::var("TIDEMARK_TOKEN").ok())?;
    let mut events = client.stream(StreamOptions::after(0).stream("notifications"));
    // One Ctrl-C listener for the whole loop: a new one per turn would miss a Ctrl-C that
    // comes between two turns.
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(ev) => {
                    let ev = ev?;
                    println!("shown {} {}", ev.seq, ev.event_type);
                }
                None => return Ok(()),
            },
            _ = &mut ctrl_c => return Ok(()),
        }
    }
}
