fn main() -> anyhow::Result<()> {
    anyhow::bail!("the CLI is not written yet")
}
