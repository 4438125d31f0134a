//! A desktop claimer: claims the app sink's deliveries, shows each, reports it done; a lease is
//! extended while a notification is on screen.
use tidemark_client::{Client, Outcome, WorkerOptions};
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
    let show = |delivery: tidemark_client::Delivery| async move {
        println!("shown on desktop {}", delivery.notification_id);
        Outcome::Done
    };
    client
        .worker("app", WorkerOptions::new("ana-laptop"))
        .run(show, stop)
        .await?;
    Ok(())
}
