//! splitway-control's own HTTP/1.1 admin server.

use std::sync::Arc;

fn main() {
    let addr = admin_http_proto::addr();
    admin_http_proto::runtime().block_on(async {
        let listener = splitway_control::bind(addr).await.expect("bind");
        splitway_control::serve(
            listener,
            admin_http_proto::metrics(),
            Arc::new(admin_http_proto::status),
            std::future::pending(),
        )
        .await
        .expect("serve");
    });
}
