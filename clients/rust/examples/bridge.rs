//! A chat bridge on its cursor: every notification posted at least once, in seq order; the
//! cursor advances only after a page is posted, so a crash hands that page over again.
use tidemark_client::{Client, ConsumerOptions};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), tidemark_client::Error> {
    let url = std::env::var("TIDEMARK_URL").unwrap_or_else(|_| "http://127.0.0.1:7700".into());
    let client = Client::new(url, std::env::var("TIDEMARK_TOKEN").ok())?;
    let stop = CancellationToken::new();
    let ctrl_c = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        ctrl_c.cancel();
    });
    let post_to_chat = |page: Vec<tidemark_client::Event>| async move {
        for ev in page {
            println!("posted {} {}", ev.seq, ev.subject);
        }
        Ok::<(), std::io::Error>(())
    };
    client
        .consumer(ConsumerOptions::new("chat-bridge", "notifications"))
        .run(post_to_chat, stop)
        .await?;
    Ok(())
}
